"""`aogpt.decode.graphs`: which steps are captured, the static shapes they are planned in, and the
fallback when capturing fails. Capturing itself needs a GPU (`aogpt bench gpu` checks it there); here
the same steps run eagerly in their static shapes, and the samples they give are checked against
every other path in tests/generation/test_seeds.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from aogpt.decode.graphs import CapturedSteps, mode
from aogpt.decode.layouts import Static, padded_steps
from aogpt.generation.decoder import DecoderSampler
from aogpt.generation.generate import generate
from aogpt.generation.settings import GenerationSettings
from tests.generation.test_generate import tiny_model


def test_steps_are_captured_on_a_gpu_only_and_only_on_the_fast_cached_path():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert mode("auto", cuda, True, False) == "capture"
    assert mode("auto", cpu, True, False) is None  # nothing to capture on a CPU
    assert mode("off", cuda, True, False) is None
    assert mode("auto", cuda, False, False) is None  # without a cache every step has its own shape
    assert mode("auto", cuda, True, True) is None  # the reference path (and compile, which takes it)
    assert mode("eager", cpu, True, False) == "eager"
    assert GenerationSettings().graphs == "auto"
    with pytest.raises(Exception, match="graphs"):
        GenerationSettings(graphs="always").validate()


def _sampler(graphs: str, steps: int = 16, n: int = 16, B: int = 6) -> DecoderSampler:
    from aogpt.generation.plan import step_counts
    from aogpt.generation.streams import SequenceStreams

    model = tiny_model("aogpt", vocab=11, block=n)
    chain = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(b)) for b in range(B)])
    plan = step_counts("bernoulli", "linear", steps, n, B, SequenceStreams(0, 0, B))
    return DecoderSampler(model, chain, torch.empty(0, dtype=torch.long), plan, GenerationSettings(graphs=graphs))


def test_static_steps_come_in_a_few_shapes_with_padding_in_a_sink_sequence():
    sampler = _sampler("eager")
    B, n = 6, 16
    assert sampler.cache.batch == B + 1 and sampler.cache.capacity == n + 1  # the sink sequence's row
    shapes = set()
    for step in sampler.steps:
        where = step.cache_pos
        R, W, Q = step.gather.shape[1], where.width, step.select.shape[1]
        assert all(x & (x - 1) == 0 for x in (R, W, Q)) and where.span == n + 1  # powers of two, the whole cache
        assert R >= step.rows and Q >= step.revealed
        sink = where.batch[step.rows:]
        assert (sink == B).all() and (where.batch[:step.rows] < B).all()  # padding rows: the sink's only
        mask = where.mask(torch.float64)[:B, 0]
        assert mask.shape == (B, W, n + 1)
        shapes.add((R, W, Q))
    assert len(shapes) <= 6 < len(sampler.steps)  # far fewer shapes than steps


def test_the_padded_layout_lays_rows_out_sequence_major_with_padding_seeing_column_zero():
    sizes = np.array([[2, 0, 1], [1, 3, 0]])
    first = np.array([[4, 4, 4], [6, 4, 5]])
    decided = np.array([[5, 4, 4], [6, 5, 5]])
    for static in (None, Static(3, 10)):
        for t, (b, col, where) in enumerate(padded_steps(sizes, first, decided, torch.device("cpu"), static)):
            assert list(b) == [s for s in range(3) for _ in range(sizes[t, s])]
            W = where.width
            assert W == (sizes[t].max() if static is None else 1 << int(np.ceil(np.log2(sizes[t].max()))))
            mask = where.mask(torch.float64)[:, 0]
            for r, (s, c) in enumerate(zip(b, col, strict=True)):
                slot = int(where.pad[r])
                assert slot // W == s and int(where.cols.view(-1)[slot]) == c
                seen = mask[s, slot % W] == 0
                want = (torch.arange(mask.shape[-1]) < min(decided[t, s], c + 1)) | (torch.arange(mask.shape[-1]) == c)
                assert torch.equal(seen, want)
            real = torch.zeros(where.cols.shape, dtype=torch.bool)
            real.view(-1)[where.pad[:len(b)]] = True
            assert (mask[~real][:, 1:] == float("-inf")).all() and (mask[~real][:, 0] == 0).all()


def test_a_failed_capture_says_so_once_and_runs_the_same_steps_without(caplog):
    """On a CPU the capture fails (no CUDA stream): one warning line, then every step eagerly, with the
    logits the eager runner gives."""
    captured, eager = _sampler("eager"), _sampler("eager")
    runner = CapturedSteps(captured.model.forward_slots, captured.cache, captured.ychain.view(-1),
                           captured.mask_dtype, capture=True)
    with caplog.at_level(logging.WARNING, logger="aogpt.decode.graphs"), torch.inference_mode():
        for step_a, step_b in zip(captured.steps[:3], eager.steps[:3], strict=True):
            got, want = runner(step_a), eager.captured(step_b)
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    warnings = [r for r in caplog.records if "could not be captured" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert not runner.capture and runner.fallback and not runner.graphs


def test_static_shapes_record_the_logits_of_the_real_rows():
    model = tiny_model("aogpt", vocab=11, block=10)
    kw = dict(num_samples=5, length=10, steps=4, seed=3, record_logits=True)
    plain, static = generate(model, **kw), generate(model, graphs="eager", **kw)
    assert torch.equal(plain.tokens, static.tokens)
    torch.testing.assert_close(plain.logits, static.logits, atol=1e-10, rtol=0, equal_nan=True)
    assert static.timing["padded_slots"] > plain.timing["padded_slots"]  # the static shapes pad more


def test_the_static_state_is_kept_per_geometry_and_rebuilt_when_a_weight_changes():
    """A second call of the same shape reuses the cache, the contents and the graphs (captured once);
    a changed weight gives a new state (the cache's adaLN tables come from the weights); a state in
    use is never handed to a second sampler."""
    from aogpt.decode.graphs import static_state

    model = tiny_model("aogpt", vocab=11, block=10)
    first = static_state(model, 4, 10, "auto", False)
    assert static_state(model, 4, 10, "auto", False) is first and static_state(model, 3, 10, "auto", False) is not first
    first.busy = True
    assert static_state(model, 4, 10, "auto", False) is not first
    first.busy = False
    kw = dict(num_samples=4, length=10, steps=4, seed=3, graphs="eager")
    a = generate(model, **kw)
    b = generate(model, **kw)
    assert torch.equal(a.tokens, b.tokens) and not static_state(model, 4, 10, "auto", False).busy
    with torch.no_grad():
        model.lm_head.weight.mul_(3)
    assert static_state(model, 4, 10, "auto", False) is not first
    changed = generate(model, **kw)
    assert torch.equal(changed.tokens, generate(model, num_samples=4, length=10, steps=4, seed=3).tokens)
