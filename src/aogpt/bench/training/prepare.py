"""`aogpt bench prepare`: the cost of `aogpt prepare`, and tokenizer workers against threads.

Two modes:

- `bench_prepare` times ``prepare CORPUS --tokenizer SPEC`` (target: shakespeare with gpt2 in <= 10 s
  on 2 CPU cores). Each run starts cold inside this process: the GPT-2 encoding is rebuilt from its
  files and the corpus re-read and re-cleaned, so the figure is what `aogpt prepare` costs minus
  interpreter start-up and imports. Wall and CPU time (all threads, and finished worker processes:
  a figure that other load on the machine inflates less than wall time), and one run's stages
  (read and clean, tokenizer, encode) timed separately.
- `bench_workers` times multi-worker tokenization on a synthetic corpus (random-word documents in a
  .jsonl, sharding on): in-process with the tokenizer's own threads, in-process with one thread
  (gpt2 only: tiktoken's threads), and N spawned worker processes (their start-up included),
  interleaved run by run; tokens/s and the speed-up over one thread (or over in-process).

Spawned tokenizer workers re-import the parent's main module; keep this module light so that a
launcher importing it costs them little: no torch at module level (`aogpt.bench.common` imports it),
and `aogpt.data.prepared` (which imports torch) only inside functions.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aogpt.data import tokenizer as tk
from aogpt.errors import AOGPTError

TARGET_SECONDS = 10.0  # shakespeare with gpt2, 2 CPU cores
QUICK = dict(repeats=1, max_docs=4, synthetic_mb=0.5)
DEFAULTS = dict(repeats=5, synthetic_mb=40.0, workers=2)
SHARD_TOKENS = 2_000_000  # the workers benchmark writes shards, as large corpora do


def _prepare(*args: Any, **kw: Any) -> dict:
    from aogpt.data.prepared import prepare

    return prepare(*args, **kw)


@contextlib.contextmanager
def gpt2_threads(threads: int | None) -> Iterator[None]:
    """Within the block, gpt2's `encode_batch` uses `threads` threads (None: its default)."""
    had, before = "threads" in vars(tk.GPT2Tokenizer), tk.GPT2Tokenizer.threads
    tk.GPT2Tokenizer.threads = threads
    try:
        yield
    finally:
        if had:
            tk.GPT2Tokenizer.threads = before
        else:
            del tk.GPT2Tokenizer.threads


def _environment(started: dict[str, Any], spec: str, threads: int | None) -> dict[str, Any]:
    """The record taken at the start (`aogpt.bench.environment`), finished, with the tokenizer's threads
    as "threads" (torch's apart)."""
    from aogpt.bench.environment import finish_environment

    env = finish_environment(started)
    env["torch_threads"] = env["threads"]
    # gpt2: tiktoken's threads; bpe: HF's (one per CPU); bytes encodes in one thread
    env["threads"] = 1 if spec == "bytes" else (threads if spec == "gpt2" and threads else tk._threads())
    return env


def _describe(env: dict[str, Any]) -> str:
    from aogpt.bench.environment import describe_environment

    return describe_environment(env).replace(" threads,", " tokenizer threads,", 1)


def _tokens(meta: dict) -> int:
    return sum(split["tokens"] for split in meta["splits"].values())


def stages(corpus: str, spec: str, max_docs: int | None = None, seed: int = 1337) -> dict[str, float]:
    """Seconds of one cold run's stages: read and clean the corpus, load (or train) the tokenizer, encode."""
    from aogpt.data.corpora import load_corpus
    from aogpt.data.shards import split_pieces

    t0 = time.perf_counter()
    docs = list(load_corpus(corpus, max_docs=max_docs, seed=seed).documents())
    t1 = time.perf_counter()
    tk._gpt2_encoding.cache_clear()
    kind, n = tk.parse_spec(spec)
    tok = tk.train_bpe(docs, n) if kind == "bpe" and n is not None else tk.load_tokenizer(spec)
    t2 = time.perf_counter()
    tok.encode_batch([p for d in docs for p in split_pieces(d)])
    t3 = time.perf_counter()
    return {"read_and_clean": t1 - t0, "tokenizer": t2 - t1, "encode": t3 - t2}


def _check(repeats: int, threads: int | None) -> None:
    if repeats < 1:
        raise AOGPTError(f"--repeats must be at least 1, got {repeats}", "e.g. --repeats 5")
    if threads is not None and threads < 1:
        raise AOGPTError(f"--threads must be >= 1, got {threads}", "e.g. --threads 2")


def bench_prepare(*, corpus: str = "shakespeare", tokenizer: str = "gpt2", repeats: int = 5,
                  max_docs: int | None = None, threads: int | None = None, seed: int = 1337,
                  out: Path | None = None, progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time `repeats` cold runs of prepare (module docstring); write DIR/prepare.{md,json} when `out` is given."""
    _check(repeats, threads)
    import torch

    from aogpt.bench.common import Target, interleaved_timings, write_outputs
    from aogpt.bench.environment import environment

    started = environment("cpu", None)  # no model computes here: no precision
    metas: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="aogpt-bench-") as tmp, gpt2_threads(threads):
        target = Path(tmp) / "prepared"

        def run() -> None:
            tk._gpt2_encoding.cache_clear()
            metas.append(_prepare(corpus, tokenizer, target, max_docs=max_docs, seed=seed, progress=False))

        def tick(key: str) -> None:  # untimed: the next run starts from nothing again
            shutil.rmtree(target, ignore_errors=True)
            if progress is not None:
                progress(len(metas), key)

        t = interleaved_timings({"prepare": run}, torch.device("cpu"), repeats, progress=tick)
        parts = stages(corpus, tokenizer, max_docs, seed)
    meta, median = metas[-1], t.wall["prepare"]
    tokens = _tokens(meta)
    result: dict[str, Any] = {
        "benchmark": "prepare", "corpus": corpus, "tokenizer": meta["tokenizer"], "max_docs": max_docs,
        "repeats": repeats, "seed": seed, "tokens": tokens,
        "documents": sum(split["documents"] for split in meta["splits"].values()),
        "seconds": t.wall, "cpu_seconds": t.cpu, "runs": t.wall_runs, "cpu_runs": t.cpu_runs,
        "tokens_per_second": tokens / median, "stages_seconds": parts,
        "environment": _environment(started, meta["tokenizer"], threads),
    }
    standard = (corpus, meta["tokenizer"], max_docs) == ("shakespeare", "gpt2", None)
    note = "absolute time, set for 2 CPU cores" + ("" if standard else "; the target is for shakespeare with gpt2")
    result["targets"] = [Target(f"time of `aogpt prepare` ÷ {TARGET_SECONDS:g} s", median / TARGET_SECONDS, 1.0,
                                False, note).to_dict()]
    if out is not None:
        result["files"] = write_outputs(out, "prepare", to_markdown(result), result)
    return result


def synthetic_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """A .jsonl of random-word documents (100-5000 words), about `megabytes` MB; returns its characters."""
    import random

    rng = random.Random(seed)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ] + "the of and to in a is that for it as was with be by on not".split() * 50
    chars = 0
    with open(path, "w", encoding="utf-8") as f:
        while chars < megabytes * 1e6:
            text = " ".join(rng.choices(words, k=rng.randint(100, 5000)))
            text = ".\n".join(text[i : i + 400] for i in range(0, len(text), 400)) + ".\n"
            f.write(json.dumps({"text": text}) + "\n")
            chars += len(text)
    return chars


def bench_workers(*, tokenizer: str = "gpt2", workers: int = 2, synthetic_mb: float = 40.0, repeats: int = 3,
                  seed: int = 1337, out: Path | None = None,
                  progress: Callable[[int, str], None] | None = None) -> dict[str, Any]:
    """Time in-process tokenization against `workers` processes (module docstring); write
    DIR/prepare-workers.{md,json} when `out` is given."""
    _check(repeats, None)
    if workers < 2:
        raise AOGPTError(f"--workers must be at least 2 to compare with in-process encoding, got {workers}",
                         "e.g. --workers 2")
    if not synthetic_mb > 0:
        raise AOGPTError(f"--synthetic-mb must be positive, got {synthetic_mb}", "e.g. --synthetic-mb 40")
    spec = tk.normalize_spec(tokenizer)  # an unknown spec is refused before the corpus is written
    import torch

    from aogpt.bench.common import interleaved_timings, write_outputs
    from aogpt.bench.environment import environment

    started = environment("cpu", None)  # no model computes here: no precision
    gpt2 = spec == "gpt2"
    modes = {"threads": (1, None)}  # name -> (workers, gpt2 threads)
    if gpt2:
        modes["one-thread"] = (1, 1)
    modes["workers"] = (workers, None)
    labels = {"threads": "in-process, the tokenizer's threads", "one-thread": "in-process, 1 thread",
              "workers": f"{workers} worker processes"}
    baseline = "one-thread" if gpt2 else "threads"
    metas: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="aogpt-bench-") as tmp:
        corpus = Path(tmp) / "synthetic.jsonl"
        chars = synthetic_corpus(corpus, synthetic_mb, seed)
        target = Path(tmp) / "prepared"
        tk.load_tokenizer(spec)  # warm the GPT-2 encoding cache for every mode alike

        def mode(name: str) -> Callable[[], None]:
            n_workers, threads = modes[name]

            def run() -> None:
                with gpt2_threads(threads):
                    metas.append(_prepare(str(corpus), spec, target, workers=n_workers, shard_tokens=SHARD_TOKENS,
                                          seed=seed, progress=False))

            return run

        def tick(key: str) -> None:  # untimed
            shutil.rmtree(target, ignore_errors=True)
            if progress is not None:
                progress(len(metas), key)

        t = interleaved_timings({m: mode(m) for m in modes}, torch.device("cpu"), repeats, progress=tick)
    tokens = _tokens(metas[-1])
    result: dict[str, Any] = {
        "benchmark": "prepare-workers", "tokenizer": spec, "workers": workers, "synthetic_mb": synthetic_mb,
        "chars": chars, "tokens": tokens, "repeats": repeats, "seed": seed, "modes": {m: labels[m] for m in modes},
        "baseline": baseline, "seconds": t.wall, "cpu_seconds": t.cpu, "runs": t.wall_runs, "cpu_runs": t.cpu_runs,
        "tokens_per_second": {m: tokens / s for m, s in t.wall.items()},
        "ratios": {f"{baseline}/{m}": t.wall[baseline] / t.wall[m] for m in modes},
        "environment": _environment(started, spec, None),
    }
    if out is not None:
        result["files"] = write_outputs(out, "prepare-workers", workers_markdown(result), result)
    return result


def to_markdown(result: dict[str, Any]) -> str:
    from aogpt.bench.common import fmt_seconds, markdown_table

    runs = ", ".join(fmt_seconds(s) for s in result["runs"]["prepare"])
    cap = f", at most {result['max_docs']} documents" if result["max_docs"] else ""
    rows = [["wall", fmt_seconds(result["seconds"]["prepare"]), runs],
            ["CPU (all threads)", fmt_seconds(result["cpu_seconds"]["prepare"]),
             ", ".join(fmt_seconds(s) for s in result["cpu_runs"]["prepare"])]]
    return "\n".join([
        f"# `aogpt prepare {result['corpus']} --tokenizer {result['tokenizer']}`",
        "",
        f"Median of {result['repeats']} cold runs in one process{cap}: {result['tokens']:,} tokens, "
        f"{result['tokens_per_second'] / 1e6:.2f} M tokens/s (wall). " + _describe(result["environment"]),
        "",
        markdown_table(["time", "median", "runs"], rows),
        "",
        "One run's stages: " + ", ".join(f"{k.replace('_', ' ')} {fmt_seconds(v)}"
                                         for k, v in result["stages_seconds"].items()) + ".",
        "",
        "Target:",
        *[t["line"] for t in result["targets"]],
    ])


def workers_markdown(result: dict[str, Any]) -> str:
    from aogpt.bench.common import fmt_ratio, fmt_seconds, markdown_table

    base = result["baseline"]
    rows = [[label, fmt_seconds(result["seconds"][m]), fmt_seconds(result["cpu_seconds"][m]),
             f"{result['tokens_per_second'][m] / 1e6:.2f} M", fmt_ratio(result["ratios"][f"{base}/{m}"])]
            for m, label in result["modes"].items()]
    return "\n".join([
        f"# Tokenization: in-process against {result['workers']} worker processes",
        "",
        f"`prepare` of {result['chars'] / 1e6:.1f} MB of synthetic text with `--tokenizer {result['tokenizer']}` "
        f"({result['tokens']:,} tokens, sharded), median of {result['repeats']} interleaved runs; worker start-up "
        "included, CPU time includes the workers'. " + _describe(result["environment"]),
        "",
        markdown_table(["mode", "wall", "CPU", "tokens / s", f"speed-up over {result['modes'][base]}"], rows),
    ])
