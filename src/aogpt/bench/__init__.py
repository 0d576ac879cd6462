"""Benchmarks users can run on their own hardware (`aogpt bench ...`, docs/benchmarks.md): the index.

The code sits in rooms by kind; each room's commands are registered in one CLI file.

- `aogpt.bench.generation` (CLI: cli/bench_generation.py): generating and scoring.
  `generate` + `generate_report` (generation time against steps, the paper's Figure 5; `hf_gpt2`:
  transformers' GPT-2 as a contender), `density` (one exact likelihood, decoder against encoder),
  `speculative` (exact self-speculative decoding), `adaptive` + `adaptive_report` (puzzle solving with
  adaptive orders), `attention` (the exact attention kernels side by side), `gap_length` (the length
  of a gap the model chooses, against the true one and a fixed guess).
- `aogpt.bench.training` (CLI: cli/bench_training.py): training and data. `train_step` +
  `train_profile` (training-step throughput of every variant), `eval` (evaluation against training, an
  ensemble member's cost), `prepare` (the cost of `aogpt prepare`, worker processes against threads),
  `recipe` + `recipe_report` + `diagnostics` (the recipe sweep behind the quickstart preset), `adapt` +
  `adapt_report` (adapting a trained GPT against AO-GPT from scratch).
- `aogpt.bench.serve` (CLI: cli/bench_serve.py): the HTTP server. `clients` (N concurrent clients
  against one request at a time), `load` (a mixed, seeded load and the server process), `soak` (the
  mixed soak, then SIGTERM under load).
- `aogpt.bench.gpu` (CLI: cli/bench_gpu.py): `aogpt bench gpu`. `run` (runs the parts), `plan` (sizes,
  time shares, the dry run's estimate), `parts` (what a part is given and records), `checks`
  (correctness on the device), `speed` (Figure 5 and training throughput), `distributed` (DDP / FSDP2
  under torchrun), `report` (markdown, JSON, PNG).
- Shared by every room (and importing none): `common` (equal sizes, interleaved wall and CPU timing,
  tables, outputs, targets), `environment` (the one record of the machine, CPU class, precision,
  threads and load that every report carries under "environment"), `limits` (the machine's matrix and
  memory rates), `roofline` (a step's bytes and its roofline time), `plot` (the Figure 5 style figure of
  generation time against steps, used by generate and the GPU report).

**A new benchmark** goes in the room of its kind (a module, plus a `_report` module when its report is
long), its command in that room's CLI file (a parser function added to the file's `BENCHMARKS`; cli/
bench.py registers every room's and needs no change), its test in the mirrored tests/bench/ROOM/, and
its launcher in benchmarks/. It records `environment.environment(...)` at its start and
`finish_environment` at its end. Code two rooms need moves up to the shared modules; a room importing
another is refused by tests/test_structure.py unless listed there (today: gpu uses generation's
`generate`). A room stays at 15 modules or fewer: past that, split it.

Every benchmark times its contenders side by side in one process run and reports medians and
ratios; the absolute numbers depend on the machine (and on its load), the ratios much less. The
scripts in `benchmarks/` only launch these commands.
"""
