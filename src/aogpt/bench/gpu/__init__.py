"""`aogpt bench gpu` (registered in cli/bench_gpu.py): every GPU path checked and measured in one run,
part by part (`run` runs the parts of `plan`). The index of all benchmarks: `aogpt.bench`."""
