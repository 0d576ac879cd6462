"""The engine without HTTP: batch invariance token for token, exact laws, continuous batching, limits."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time

import numpy as np
import pytest
import torch

from aogpt.errors import AOGPTError
from aogpt.generation.conditioning import Conditioning
from aogpt.generation.generate import generate
from aogpt.serve import Busy, Draining, Engine, EngineLimits, Job
from aogpt.serve.batching import row_invariant
from aogpt.serve.engine import job_size
from tests.generation.test_generate import chi2_pvalue, exact_joint, tiny_model
from tests.serve.conftest import random_float32


def template(length: int, known: dict[int, int]) -> Conditioning:
    pos = sorted(known)
    return Conditioning(length, torch.tensor(pos, dtype=torch.long), torch.tensor([known[p] for p in pos]))


# sixteen different requests: orders, policies, prompts, templates, samples, speculative and adaptive decoding
REQUESTS = [
    {"length": 64, "seed": 1},
    {"length": 48, "seed": 2, "temperature": 0.7},
    {"length": 64, "seed": 3, "steps": 16},
    {"length": 40, "seed": 4, "top_p": 0.9},
    {"length": 48, "seed": 5, "order": "l2r", "prompt": [5, 9, 200, 31]},
    {"length": 32, "seed": 6, "order": "l2r", "top_k": 20},
    {"condition": template(40, {0: 7, 1: 8, 20: 9, 39: 10}), "seed": 7, "policy": "count", "steps": 8},
    {"condition": template(24, {3: 300, 4: 301}), "seed": 8, "order": "blockwise:4", "steps": 6},
    {"length": 48, "seed": 9, "speculative": 3},
    {"length": 40, "seed": 10, "speculative": "auto", "temperature": 0.8},
    {"length": 24, "seed": 11, "order": "confidence", "candidates": 6},
    {"length": 20, "seed": 12, "order": "entropy", "steps": 10},
    {"length": 32, "seed": 13, "num_samples": 3, "top_p": 0.8},
    {"length": 28, "seed": 14, "num_samples": 2, "policy": "count", "steps": 7, "order": "window:3"},
    {"length": 56, "seed": 15, "schedule": "cosine", "steps": 20},
    {"length": 64, "seed": 16, "greedy": True, "order": "mallows:0.5"},
]


def _submit_all(engine: Engine, requests: list[dict]) -> list[Job]:
    jobs = [Job(kw, *job_size(kw, engine.model.config)) for kw in requests]
    for job in jobs:
        engine.submit(job)
    for job in jobs:
        assert job.finished.wait(120)
        assert job.error is None, job.error
    return jobs


def test_packed_decode_path_is_row_invariant(quickstart_sized):
    """The premise of batch invariance on this machine: the fast decode path's kernels (chosen among
    the row-invariant ones) give a row the same bits whatever the number of rows, as a step calls
    them (the fused GELU and residual adds included); the check tells a kernel that does not."""
    from aogpt.decode.kernels import LinearKernel
    from aogpt.inference import for_inference

    fast = for_inference(quickstart_sized)
    assert fast.decode_choice.row_invariant and row_invariant(fast)
    mixed = for_inference(quickstart_sized)  # the same copy with one kernel whose rows depend on the count
    head = mixed.lm_head
    try:
        mixed.lm_head = LinearKernel(head.weight, head.bias, "plain")
        mixed.lm_head.forward = lambda x: torch.nn.functional.linear(x, head.weight) + x.shape[0] * 1e-6
        assert not row_invariant(mixed)
    finally:
        mixed.lm_head = head


def test_a_seeded_request_gets_the_same_tokens_alone_in_a_batch_of_16_and_offline(quickstart_sized):
    model = quickstart_sized
    offline = [generate(model, **kw).tokens for kw in REQUESTS]
    with Engine(model, EngineLimits(max_sequences=64)) as engine:
        assert engine.row_invariant
        alone = [engine.run(**kw).tokens for kw in REQUESTS[::3]]
        before = dict(engine.stats)
        together = _submit_all(engine, REQUESTS)
        steps = engine.stats["steps"] - before["steps"]
    for i, kw in enumerate(REQUESTS):
        assert torch.equal(together[i].result.tokens, offline[i]), f"request {i} {kw} differs in a batch of 16"
    for i, tokens in zip(range(0, len(REQUESTS), 3), alone, strict=True):
        assert torch.equal(tokens, offline[i]), f"request {i} differs alone"
    forwards = sum(job.result.timing["forwards"] for job in together)
    assert steps < forwards / 4, f"{steps} engine steps for {forwards} forwards: the requests were not batched"


def test_what_the_server_samples_follows_the_exact_law():
    """One token per step over 3 positions in random orders: many concurrent requests, their samples
    pooled, against the joint enumerated over all orders (and, for power, a wrong joint)."""
    V, n = 3, 3
    model = tiny_model("aogpt", vocab=V, block=n, scale=0.8, seed=5)
    requests = [{"num_samples": 2000, "length": n, "steps": n, "policy": "count", "seed": 100 + i, "batch_size": 250}
                for i in range(12)]
    with Engine(model, EngineLimits(max_sequences=4096, max_tokens_in_flight=2**20)) as engine:
        jobs = _submit_all(engine, requests)
        assert engine.stats["steps"] < sum(j.result.timing["forwards"] for j in jobs)  # they ran together
    tokens = torch.cat([j.result.tokens for j in jobs])
    exact = exact_joint(model, n, V, [(1.0, [1, 1, 1])])
    assert chi2_pvalue(tokens, V, exact) > 1e-3
    l2r = np.zeros(V ** n)
    for xi, x in enumerate(itertools.product(range(V), repeat=n)):
        _, losses = model(torch.tensor([x]))
        l2r[xi] = math.exp(-losses.sum().item())
    assert chi2_pvalue(tokens, V, l2r) < 1e-6


def test_parallel_bernoulli_steps_served_follow_their_exact_law():
    V, n = 3, 3
    model = tiny_model("sigma", vocab=V, block=n, scale=0.8, seed=6)
    requests = [{"num_samples": 2000, "length": n, "steps": 2, "policy": "bernoulli", "seed": 200 + i,
                 "batch_size": 250} for i in range(12)]
    with Engine(model, EngineLimits(max_sequences=4096, max_tokens_in_flight=2**20)) as engine:
        tokens = torch.cat([j.result.tokens for j in _submit_all(engine, requests)])
    plans = [(math.comb(3, k) / 8, [k, 3 - k]) for k in range(4)]
    assert chi2_pvalue(tokens, V, exact_joint(model, n, V, plans)) > 1e-3
    assert chi2_pvalue(tokens, V, exact_joint(model, n, V, [(1.0, [1, 1, 1])])) < 1e-6


def _started(engine: Engine, kw: dict, steps: int = 1) -> tuple[Job, threading.Event]:
    """Submit a job and an event set once it has done `steps` steps."""
    seen = threading.Event()
    count = [0]

    def on_event(kind, payload):
        count[0] += kind == "step"
        if count[0] >= steps:
            seen.set()

    job = engine.submit(Job(kw, *job_size(kw, engine.model.config), on_event))
    return job, seen


def test_requests_join_the_running_batch_and_leave_when_done():
    model = random_float32(block_size=128)
    with Engine(model) as engine:
        long, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"}, steps=5)
        assert running.wait(30)
        short = engine.submit(Job({"length": 16, "seed": 1, "order": "l2r"}, 1, 16))
        assert short.finished.wait(30) and short.error is None
        assert not long.finished.is_set(), "the short request waited for the long one"
        assert long.finished.wait(60) and long.error is None
        assert engine.stats["steps"] < 128 + 16  # the short one's steps rode on the long one's
    assert torch.equal(short.result.tokens, generate(model, length=16, seed=1, order="l2r").tokens)


def test_a_cancelled_job_frees_its_slot_at_the_next_step():
    model = random_float32(block_size=128)
    with Engine(model, EngineLimits(max_sequences=1, max_queue=4)) as engine:
        first, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"})
        second = engine.submit(Job({"length": 8, "seed": 1}, 1, 8))
        assert running.wait(30)
        assert engine.load()["waiting"] == 1
        first.cancel()
        assert second.finished.wait(30) and second.error is None
        assert first.finished.is_set() and first.result is None and first.error[0] == 503
        assert engine.stats["cancelled"] == 1 and engine.load()["running"] == 0


def test_a_full_queue_is_busy_and_a_draining_engine_takes_nothing_new():
    model = random_float32(block_size=128)
    with Engine(model, EngineLimits(max_sequences=1, max_queue=1)) as engine:
        first, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"})
        assert running.wait(30)
        queued = engine.submit(Job({"length": 8, "seed": 1}, 1, 8))
        with pytest.raises(Busy) as busy:
            engine.submit(Job({"length": 8, "seed": 2}, 1, 8))
        assert busy.value.retry_after >= 1
        engine.drain()
        with pytest.raises(Draining):
            engine.submit(Job({"length": 8, "seed": 3}, 1, 8))
        assert first.finished.wait(60) and queued.finished.wait(60)  # accepted work still finishes
        assert first.error is None and queued.error is None


def test_tokens_in_flight_are_capped_and_oversized_requests_refused():
    model = random_float32(block_size=128)
    with Engine(model, EngineLimits(max_tokens_in_flight=200)) as engine:
        first, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"})
        assert running.wait(30)
        second = engine.submit(Job({"length": 100, "seed": 1}, 1, 100))
        assert engine.load()["waiting"] == 1  # 128 + 100 > 200: it waits for the first
        assert second.finished.wait(60) and first.finished.is_set()
        with pytest.raises(AOGPTError, match="more than this server takes"):
            engine.submit(Job({"length": 128, "num_samples": 2}, 2, 256))


def test_a_failure_inside_the_step_reaches_the_client_as_one_line_without_traceback(monkeypatch):
    model = random_float32()
    with Engine(model) as engine:
        def broken(*args, **kwargs):
            raise RuntimeError("boom in a kernel")

        monkeypatch.setattr(engine.runner, "forward_slots", broken)
        job = engine.submit(Job({"length": 8, "seed": 0}, 1, 8))
        assert job.finished.wait(30)
    status, message = job.error
    assert status == 500 and "\n" not in message and "Traceback" not in message and "boom" not in message
    assert engine.stats["failed"] == 1


def test_served_logits_are_bitwise_those_of_offline_generation(quickstart_sized):
    """A sharper oracle than tokens: every logit the model gave each request, bit for bit."""
    requests = [dict(kw, record_logits=True) for kw in REQUESTS if "speculative" not in kw][:8]
    offline = [generate(quickstart_sized, **kw).logits for kw in requests]
    with Engine(quickstart_sized) as engine:
        served = [job.result.logits for job in _submit_all(engine, requests)]
    for i, (a, b) in enumerate(zip(offline, served, strict=True)):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), f"request {i}"


def test_an_encoder_is_served_one_forward_at_a_time_with_the_same_tokens():
    model = random_float32(variant="encoder-mdm", block_size=24)
    requests = [{"length": 24, "seed": s, "steps": 6} for s in range(4)] + [{"length": 16, "seed": 9,
                                                                          "order": "confidence"}]
    with Engine(model) as engine:
        jobs = _submit_all(engine, requests)
    for job, kw in zip(jobs, requests, strict=True):
        assert torch.equal(job.result.tokens, generate(model, **kw).tokens)


# ---------------------------------------------------------------- deadlines, draining, liveness
def _slowed(engine: Engine, seconds: float, gate: threading.Event | None = None) -> None:
    """Make every engine step take at least `seconds` (and, with `gate`, wait for it to open)."""
    forward = engine.runner.forward_slots

    def slow(*args, **kwargs):
        if gate is not None:
            gate.wait(30)
        time.sleep(seconds)
        return forward(*args, **kwargs)

    engine.runner.forward_slots = slow


def test_a_job_that_cannot_start_within_its_queue_deadline_gets_503_with_retry_after():
    model = random_float32(block_size=128)
    with Engine(model, EngineLimits(max_sequences=1, queue_timeout=0.3)) as engine:
        _slowed(engine, 0.02)  # the first job: 128 steps, 2.5 s at least
        first, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"})
        assert running.wait(30)
        second = engine.submit(Job({"length": 8, "seed": 1}, 1, 8))
        assert second.finished.wait(10) and not first.finished.is_set()
        assert second.error[0] == 503 and "could not start within 0.3 s" in second.error[1]
        assert second.retry_after >= 1 and second.outcome == "expired" and engine.stats["expired"] == 1
        assert first.finished.wait(60) and first.error is None  # the running one is not disturbed


def test_a_running_job_past_its_deadline_is_cancelled_with_a_clear_error_and_the_engine_goes_on():
    model = random_float32(block_size=128)
    with Engine(model, EngineLimits(timeout=30)) as engine:
        _slowed(engine, 0.02)
        late = engine.submit(Job({"length": 128, "seed": 0, "order": "l2r"}, 1, 128, timeout=0.3))
        assert late.finished.wait(10)
        assert late.error[0] == 503 and "did not finish within its deadline of 0.3 s" in late.error[1]
        assert late.outcome == "timed_out" and engine.stats["timed_out"] == 1 and late.result is None
        assert engine.load()["running"] == 0
        with pytest.raises(TimeoutError, match="deadline of 0.2 s"):
            engine.run(timeout=0.2, length=128, seed=1, order="l2r")
        assert torch.equal(engine.run(length=8, seed=2).tokens, generate(model, length=8, seed=2).tokens)


def test_drain_with_a_timeout_cancels_what_is_left_at_its_deadline():
    model = random_float32(block_size=128)
    engine = Engine(model, EngineLimits(max_sequences=1)).start()
    _slowed(engine, 0.02)
    first, running = _started(engine, {"length": 128, "seed": 0, "order": "l2r"})
    queued = engine.submit(Job({"length": 128, "seed": 1, "order": "l2r"}, 1, 128))
    assert running.wait(30)
    start = time.monotonic()
    engine.drain(0.3)
    with pytest.raises(Draining):
        engine.submit(Job({"length": 8, "seed": 3}, 1, 8))
    engine.stop()  # waits for the drain deadline, not for the requests
    assert time.monotonic() - start < 5
    for job in (first, queued):
        assert job.finished.is_set() and job.error[0] == 503 and "shut down" in job.error[1]


def test_health_tells_busy_from_stuck_without_the_engine_lock():
    model = random_float32(block_size=64)
    gate = threading.Event()
    with Engine(model, EngineLimits(stall_after=0.3)) as engine:
        assert engine.health()["engine"] == "idle"
        _slowed(engine, 0.0, gate)  # the next step waits for the gate: the engine is stuck in it
        job = engine.submit(Job({"length": 64, "seed": 0, "order": "l2r"}, 1, 64))
        time.sleep(0.6)

        def hold_the_lock() -> None:
            with engine._lock:
                time.sleep(2)

        holder = threading.Thread(target=hold_the_lock)
        holder.start()  # someone holds the engine's lock: health and load still answer
        time.sleep(0.1)
        answered = []
        asker = threading.Thread(target=lambda: answered.append((engine.health(), engine.load())))
        asker.start()
        asker.join(1.0)
        assert answered, "health waited for the engine's lock"
        health, load = answered[0]
        assert health["engine"] == "stuck" and health["seconds_since_progress"] > 0.3 and load["running"] == 1
        holder.join()
        gate.set()
        assert job.finished.wait(30) and job.error is None
        assert engine.health()["engine"] == "idle" and engine.health()["longest_stall"] >= 0.5
    assert engine.health()["engine"] == "stopped"


def test_the_mixed_load_without_http_gets_offline_tokens_under_cancellations():
    """The six request kinds of the serving soak (`aogpt.bench.serve.load.KINDS`), four seeds each,
    32 at a time from 8 submitting threads, a quarter cancelled mid-way by their owner: every job
    ends (result or 503), and every result is offline `generate()`'s."""
    from aogpt.bench.serve.load import KINDS
    from aogpt.serve.protocol import CompletionRequest, to_generate
    from tests.serve.conftest import slow_loaded

    loaded = slow_loaded()
    cfg = loaded.model.config
    requests = [to_generate(CompletionRequest(**body, seed=s), cfg, loaded.tokenizer, 1)[0]
                for body in KINDS for s in range(4)]
    offline = [generate(loaded.model, **kw).tokens for kw in requests]
    rng = random.Random(0)
    jobs: list[tuple[int, Job]] = []
    with Engine(loaded.model, EngineLimits(timeout=120)) as engine:
        def client(c: int) -> None:
            for k in range(12):
                i = rng.randrange(len(requests))
                job, started = _started(engine, requests[i], steps=2)
                jobs.append((i, job))
                if (c + k) % 4 == 0 and started.wait(60):
                    job.cancel()
                assert job.finished.wait(120), "a job never ended"

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert len(jobs) == 96 and all(j.finished.is_set() for _, j in jobs)
    done = [(i, j) for i, j in jobs if j.error is None]
    assert len(done) >= 60 and all(j.error[0] == 503 for _, j in jobs if j.error is not None)
    for i, job in done:
        assert torch.equal(job.result.tokens, offline[i]), f"request {i} differs from generate()"


def test_a_loop_that_dies_answers_its_requests_with_500_and_health_says_stopped(monkeypatch):
    model = random_float32()
    engine = Engine(model)
    monkeypatch.setattr(engine, "_expire", lambda: 1 / 0)  # a bug in the loop itself, not in a request
    engine.start()
    job = engine.submit(Job({"length": 8, "seed": 0}, 1, 8))
    assert job.finished.wait(10) and job.error[0] == 500 and "engine stopped" in job.error[1]
    engine._loop.join(10)
    assert engine.health()["engine"] == "stopped" and engine.load()["running"] == 0
    engine.stop()
