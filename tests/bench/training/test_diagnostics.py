"""The plateau diagnostics (`aogpt.bench.training.diagnostics`) against independent computations."""

from __future__ import annotations

import math

import pytest
import torch

from aogpt.bench.training import diagnostics
from aogpt.config import model_config
from aogpt.model import Transformer


def tiny(seed: int = 0, variant: str = "aogpt", **over) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11,
                                    target_dim=8, **over))


def batch(B: int = 3, n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 11, (B, n), generator=g), torch.rand(B, n, generator=g).argsort(1)


def test_neighbour_attention_matches_a_loop_over_queries_and_is_one_when_blind():
    model = tiny()
    with torch.no_grad():
        for p in model.target_pathway().values():
            p.normal_(0, 0.5)  # make the target pathway matter
    idx, order = batch()
    got = diagnostics.neighbour_attention(model, idx, order)
    # independently: capture each block's attention input, then for every query slot recompute its
    # attention weights and the mass on keys whose token sits within 1 of the slot's target
    inputs = []
    hooks = [b.attn.c_attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.transformer.h]
    tokens, pos, target = model.slots_for_order(idx, order)
    with torch.no_grad():
        model.forward_slots(tokens, pos, target)
    for h in hooks:
        h.remove()
    for layer, (block, h) in enumerate(zip(model.transformer.h, inputs, strict=True)):
        attn, heads = block.attn, []
        with torch.no_grad():
            q, k, _ = attn.c_attn(h).split(16, dim=2)
        for head in range(2):
            lifts = []
            for b in range(3):
                for i in range(8):
                    with torch.no_grad():
                        qi = attn.q_norm(q[b, i, head * 8:(head + 1) * 8])
                        ks = attn.k_norm(k[b, : i + 1, head * 8:(head + 1) * 8])
                        w = torch.softmax(ks @ qi / math.sqrt(8), 0)
                    near = [j for j in range(i + 1) if abs(int(pos[b, j]) - 1 - int(target[b, i])) <= 1]
                    if near:
                        lifts.append(float(w[near].sum()) / (len(near) / (i + 1)))
            heads.append(sum(lifts) / len(lifts))
        assert got[layer] == pytest.approx(max(heads), rel=1e-5)
    blind = tiny()
    with torch.no_grad():
        for block in blind.transformer.h:
            block.attn.c_attn.weight[:32].zero_()  # q = k = 0: every visible key weighs the same
            block.attn.c_attn.bias[:32].zero_()
    assert diagnostics.neighbour_attention(blind, idx, order) == pytest.approx([1.0, 1.0])


def test_modulation_starts_at_zero_and_measures_the_target_dependent_part():
    model = tiny()
    zero = diagnostics.modulation(model)
    assert all(v == 0 for k, v in zero.items() if k != "target_table")  # adaLN-Zero
    with torch.no_grad():
        for block in model.transformer.h:
            block.adaLN[-1].bias.fill_(0.5)  # the same for every target position
    same = diagnostics.modulation(model)
    assert same["gate_attn"] == pytest.approx(0.5) and same["gate_attn/target"] == pytest.approx(0, abs=1e-7)
    assert diagnostics.modulation(tiny(variant="sigma")) == {}


def test_gradient_norms_equal_backward_and_leave_grads_alone():
    model, (idx, order) = tiny(), batch()
    with torch.no_grad():
        for p in model.target_pathway().values():
            p.normal_(0, 0.1)
    got = diagnostics.gradients(model, idx, order)
    assert all(p.grad is None for p in model.parameters())
    model(idx, order)[1].mean().backward()
    table = model.transformer.wtpe.weight.grad.norm().item()
    total = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None))
    assert got["grad/target_table"] == pytest.approx(table, rel=1e-5)
    assert got["grad/all"] == pytest.approx(total, rel=1e-5)


def test_the_unigram_level_is_the_cross_entropy_of_the_training_counts(bytes_data):
    from aogpt.data import PreparedData

    data = PreparedData(bytes_data)
    windows = torch.from_numpy(data.split("val")[:64].astype("int64")).view(4, 16)
    train = data.split("train").tolist()
    V = data.vocab_size
    counts = [train.count(t) for t in range(V)]
    nats = -sum(math.log((counts[t] + 1) / (len(train) + V)) for t in windows.flatten().tolist())
    bytes_ = int(data.token_byte_lengths()[windows].sum())
    assert diagnostics.unigram_bpb(data, windows) == pytest.approx(nats / bytes_ / math.log(2), rel=1e-9)
