#!/usr/bin/env bash
# The one command to run on a machine with a GPU (docs/gpu.md): `aogpt bench gpu` with the full plan
# (correctness on the device, the paper's Figure 5, DDP/FSDP2 under torchrun, training throughput; about
# 5-8 minutes on one H100/H200), cut off by `timeout` before a 10-minute limit, its report written into
# OUTPUT_DIR as it goes (so a run cut short keeps every finished part):
#
#   bash scripts/gpu-check.sh [OUTPUT_DIR [more `aogpt bench gpu` flags, e.g. --parts training]]
#
# OUTPUT_DIR defaults to $OUT, else ./gpu-check. It ends up holding gpu.md, gpu.json, gpu-figure5.png and
# gpu-check.log (everything printed). Needs python3 with torch, numpy, scipy, safetensors, tqdm (and
# transformers, matplotlib for the GPT-2 contender and the figure); the package is used from src/, not
# installed. Exit status: aogpt's (0 every check passed, 1 a check failed or a part broke, 2 bad input),
# 124 when the time limit cut the run. AOGPT_GPU_LIMIT (seconds, default 570) and PYTHON override.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${OUT:-gpu-check}}"
shift || true
mkdir -p "$out" && out="$(cd "$out" && pwd)"
log="$out/gpu-check.log"
python="${PYTHON:-python3}"
limit="${AOGPT_GPU_LIMIT:-570}"

cd "$root"
{
    echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda",
torch.version.cuda, "gpus", torch.cuda.device_count())'
} >"$log" 2>&1

PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    timeout --kill-after=20 "$limit" "$python" -u -m aogpt bench gpu --out "$out" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
echo "gpu-check: exit status $status$([ "$status" = 124 ] && echo " (cut at the ${limit} s limit)")" | tee -a "$log"
exit "$status"
