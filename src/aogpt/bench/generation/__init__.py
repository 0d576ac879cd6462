"""Benchmarks of generation and scoring (`aogpt bench generate|density|speculative|adaptive|attention`,
registered in cli/bench_generation.py): generation time against steps (the paper's Figure 5), the cost
of one exact likelihood, exact self-speculative decoding, puzzle solving with adaptive orders, and the
exact attention kernels. The index of all benchmarks: `aogpt.bench`."""
