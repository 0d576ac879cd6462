"""The HTTP server under load (`aogpt bench serve`, registered in cli/bench_serve.py): concurrent clients
against one request at a time, and the mixed soak. The index of all benchmarks: `aogpt.bench`."""
