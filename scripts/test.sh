#!/usr/bin/env bash
# Install (if needed) and run the whole test suite. Exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
