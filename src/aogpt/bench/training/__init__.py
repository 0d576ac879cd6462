"""Benchmarks of training and data (`aogpt bench train|eval|prepare|recipe|adapt`, registered in
cli/bench_training.py): training-step throughput, evaluation against training, the cost of `aogpt
prepare`, the recipe sweep behind the quickstart preset, and adapting a trained GPT. The index of all
benchmarks: `aogpt.bench`."""
