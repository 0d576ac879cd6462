"""A gated pathway (`aogpt.pathway`): read left to right, the adapted model is its source after any
fine-tuning, bit for bit as at step 0, for every source family and both variants; and the check that
says so fails when the gate is bypassed."""

from __future__ import annotations

import pytest
import torch

from aogpt.adaptation import adapt
from aogpt.orders import make_order_sampler
from tests.adaptation.conftest import make_hf
from tests.adaptation.test_adapt import TOL, _source_logits

ORDERS = "uniform*0.5+infill:6*0.5"  # what fine-tuning reads: random and infilling orders


def fine_tune(model: torch.nn.Module, steps: int = 3, seed: int = 0, vocab: int = 250) -> None:
    """A few AdamW steps on random and infilling orders, at a rate that moves every trained weight."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    n = model.config.block_size
    model.train()
    for _ in range(steps):
        x = torch.randint(0, vocab, (4, n), generator=g)
        order = make_order_sampler(ORDERS).sample(4, n, "cpu", g)
        model(x, order)[1].mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def left_to_right_after_fine_tuning(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                     torch.Tensor]:
    """(left-to-right logits at step 0, after fine-tuning, and how far a random order's logits moved)."""
    order = torch.stack([torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(s))
                         for s in range(x.shape[0])])
    with torch.no_grad():
        before, random_before = model(x)[0], model(x, order)[0]
    fine_tune(model)
    with torch.no_grad():
        after, random_after = model(x)[0], model(x, order)[0]
    return before, after, (random_after - random_before).abs().max()


def bypass_the_gate(monkeypatch) -> None:
    """Every slot through the pathway, whatever its order: what the tests below must catch."""
    import aogpt.model

    monkeypatch.setattr(aogpt.model, "left_to_right_slots",
                        lambda pos, target, context=None: torch.zeros(pos.shape, dtype=torch.bool))


CASES = [("gpt2", "aogpt", 0), ("gpt2", "sigma", 4), ("llama", "aogpt", 4), ("llama", "sigma", 0),
         ("qwen2", "aogpt", 0), ("qwen2", "sigma", 4)]


@pytest.mark.parametrize(("arch", "variant", "rank"), CASES)
def test_left_to_right_stays_the_source_after_fine_tuning(hf_models, arch, variant, rank):
    model = adapt(hf_models[arch], variant, pathway="gated", rank=rank).model
    x = torch.randint(0, 250, (3, model.config.block_size), generator=torch.Generator().manual_seed(1))
    before, after, moved = left_to_right_after_fine_tuning(model, x)
    assert moved > 1e-3  # the pathway learnt: other orders changed
    assert torch.equal(after, before)  # left to right: bit for bit what it was
    theirs = _source_logits(hf_models[arch], x, model.transformer.wnonee.weight.detach())
    assert theirs.std() > 0.5
    torch.testing.assert_close(after, theirs, atol=TOL, rtol=0)  # and the source's, as at step 0


@pytest.mark.parametrize(("arch", "variant", "rank"), CASES[::2])
def test_the_check_fails_when_the_gate_is_bypassed(hf_models, arch, variant, rank, monkeypatch):
    bypass_the_gate(monkeypatch)
    model = adapt(hf_models[arch], variant, pathway="gated", rank=rank).model
    x = torch.randint(0, 250, (3, model.config.block_size), generator=torch.Generator().manual_seed(1))
    before, after, _ = left_to_right_after_fine_tuning(model, x)
    assert not torch.equal(after, before)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["aogpt", "sigma"])
def test_our_gpt_run_stays_itself_bit_for_bit(tiny_gpt_run, variant, monkeypatch):
    import aogpt

    source = aogpt.load(tiny_gpt_run).model
    x = torch.randint(0, 256, (2, source.config.block_size), generator=torch.Generator().manual_seed(0))
    model = adapt(tiny_gpt_run, variant, pathway="gated", rank=0).model
    with torch.no_grad():
        theirs = source(x)[0]
    before, after, moved = left_to_right_after_fine_tuning(model, x)
    assert moved > 1e-3
    assert torch.equal(before, theirs) and torch.equal(after, theirs)  # the same operations on the same weights
    bypass_the_gate(monkeypatch)
    model = adapt(tiny_gpt_run, variant, pathway="gated", rank=0).model
    before, after, _ = left_to_right_after_fine_tuning(model, x)
    assert not torch.equal(after, theirs)


def test_the_identity_run_of_any_order_is_the_source(hf_models):
    """Slots of a random or infilling order that still read left to right (the order's leading identity
    run) give the source's logits, in the same forward as the slots the pathway computes."""
    model = adapt(hf_models["llama"], "aogpt", pathway="gated", rank=4).model
    fine_tune(model)
    n = model.config.block_size
    x = torch.randint(0, 250, (4, n), generator=torch.Generator().manual_seed(3))
    order = make_order_sampler("infill:8").sample(4, n, "cpu", torch.Generator().manual_seed(4))
    order[0] = torch.arange(n).flip(0)  # no identity run
    from aogpt.orders import identity_run

    runs = identity_run(order)
    assert runs[1:].max() > 2
    with torch.no_grad():
        l2r, mixed = model(x)[0], model(x, order)[0]
    for b, r in enumerate(runs.tolist()):  # the mixed forward multiplies the source's rows in groups of another
        # size, which an AVX2 CPU's GEMM rounds differently (about 2e-6 here); the pathway's rows differ by > 1e-3
        torch.testing.assert_close(mixed[b, :r], l2r[b, :r], atol=1e-5, rtol=0)
        if r < n:
            assert (mixed[b, r:] - l2r[b, order[b, r:]]).abs().max() > 1e-3  # the rest is the pathway's


def test_a_left_to_right_row_teaches_the_pathway_nothing(hf_models):
    model = adapt(hf_models["gpt2"], "aogpt", pathway="gated", rank=0).model.train()
    x = torch.randint(0, 250, (2, model.config.block_size), generator=torch.Generator().manual_seed(5))
    loss = model(x)[1].mean()
    assert not loss.requires_grad  # no trained weight is read: the loss does not depend on any
    n = model.config.block_size
    model(x, torch.stack([torch.arange(n), torch.arange(n).flip(0)]))[1].mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(p.grad is None for n_, p in model.named_parameters() if not p.requires_grad)


def test_only_the_pathway_trains_and_the_checkpoint_says_so(hf_models, tmp_path):
    import aogpt
    from aogpt.pathway import is_pathway

    adapted = adapt(hf_models["qwen2"], "aogpt", tmp_path / "gated", pathway="gated", rank=8)
    model = adapted.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(is_pathway(n) for n in trainable)
    assert any(n.endswith("delta_up") for n in trainable) and any("adaLN" in n for n in trainable)
    from aogpt.checkpoint import find_checkpoint, read_config

    assert set(read_config(find_checkpoint(tmp_path / "gated"))["pathway"]["trained"]) == trainable
    loaded = aogpt.load(tmp_path / "gated", weights="raw")
    assert loaded.config.pathway == "gated" and loaded.config.pathway_rank == 8
    assert {n for n, p in loaded.model.named_parameters() if p.requires_grad} == trainable
    assert adapted.meta["recipe"] == "adapt-gated"


def test_bad_pathway_requests_are_refused(hf_models):
    from aogpt.errors import AOGPTError

    with pytest.raises(AOGPTError, match="gated pathway"):
        adapt(hf_models["gpt2"], "aogpt", rank=4)
    with pytest.raises(AOGPTError, match="pathway"):
        adapt(hf_models["gpt2"], "aogpt", pathway="split")


def test_a_source_without_a_start_token_stays_exact(tmp_path):
    folder = make_hf(tmp_path, "qwen2", bos=False, tied=False, seed=3)
    model = adapt(folder, "sigma", pathway="gated", rank=2).model
    x = torch.randint(0, 250, (2, model.config.block_size), generator=torch.Generator().manual_seed(2))
    before, after, _ = left_to_right_after_fine_tuning(model, x)
    assert torch.equal(after, before)


@pytest.fixture(scope="module")
def tiny_gpt_run(tmp_path_factory, bytes_data):
    from aogpt.cli import main

    out = tmp_path_factory.mktemp("runs") / "gpt"
    assert main(["train", "--preset", "tiny", "--variant", "gpt", "--data", str(bytes_data), "--out", str(out),
                 "--max-steps", "4", "--no-progress"]) == 0
    return out
