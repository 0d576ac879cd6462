"""Benchmarks users can run on their own hardware (`aogpt bench ...`, docs/benchmarks.md).

- `aogpt.bench.generation.generate`: generation time against steps (the paper's Figure 5);
- `aogpt.bench.generation.density`: the cost of one exact sequence likelihood, decoder against encoder;
- `aogpt.bench.training.train_step`: training-step throughput of every variant at equal size;
- `aogpt.bench.training.eval`: evaluation against training throughput, and the cost of an ensemble member;
- `aogpt.bench.training.prepare`: the cost of `aogpt prepare`, and tokenizer worker processes against threads;
- `aogpt.bench.common`: what they share (equal sizes, interleaved wall and CPU timing, tables, outputs).

Every benchmark times its contenders side by side in one process run and reports medians and
ratios; the absolute numbers depend on the machine (and on its load), the ratios much less. The
scripts in `benchmarks/` only launch these commands.
"""
