#!/usr/bin/env bash
# Install (if needed) and run the whole test suite. Exits non-zero when a test fails.
#
# With no arguments it first runs the tests whose path depends on the CPU's instruction set as on an
# AVX2-only CPU (the lesser-CPU switch AOGPT_CPU=avx2, with PyTorch's own limits ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS; docs/cpu.md), so a machine with bf16 units also
# checks the paths the most common CPUs take; then the whole suite as the machine is. Arguments go to
# pytest (the whole-suite pass only).
#
# Both passes run in parallel processes (pytest-xdist): one per CPU, at most 4; each test file runs
# whole in one process, so a module's fixtures (a trained run, a reproduction) are built once; files
# with a test marked slow start first (tests/conftest.py), so no process is left alone with one at the end.
# `bash scripts/test.sh -n 0 ...` runs the tests in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --tests
CPU_CLASS_TESTS=(tests/test_capability.py tests/test_precision.py tests/test_inference.py tests/test_attention.py
                 tests/generation/test_precision.py tests/generation/test_generate.py tests/bench/generation/test_generate.py
                 tests/cli/test_precision_flags.py tests/cli/test_sample.py tests/decode/test_decode.py
                 tests/generation/test_seeds.py tests/bench/test_roofline.py tests/test_kv_cache.py
                 tests/bench/gpu/test_run.py::test_the_correctness_part_on_the_cpu_passes_and_skips_the_cuda_checks)
PARALLEL=(-n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder)
lesser=0
if [ "$#" -eq 0 ] && [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "== the CPU-dependent tests as on an AVX2-only CPU (AOGPT_CPU=avx2)"
  AOGPT_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    .venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" -rs "${CPU_CLASS_TESTS[@]}" || lesser=$?
  echo "== the whole suite on this CPU"
fi
status=0
.venv/bin/python -m pytest -p no:cacheprovider "${PARALLEL[@]}" "$@" || status=$?
if [ "$lesser" -ne 0 ]; then
  echo "error: tests failed as on an AVX2-only CPU (AOGPT_CPU=avx2; see the first part of the output)" >&2
  exit "$lesser"
fi
exit "$status"
