"""The decoder against independent computations: prefix-by-prefix conditionals, causality, and a
hand-written GPT-2 forward for the `gpt` variant."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from aogpt.config import TARGET_INJECTIONS, model_config
from aogpt.errors import AOGPTError
from aogpt.model import Transformer

V, N = 11, 4


def tiny(variant: str = "aogpt", seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(model_config(variant, n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=V,
                                     target_dim=8, **kw)).double().eval()
    with torch.no_grad():  # adaLN-Zero starts as the identity; randomise so every path matters
        for name, p in model.named_parameters():
            if "adaLN" in name or name.endswith("bias") or p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def prefix_conditional(model: Transformer, idx: torch.Tensor, order: torch.Tensor, i: int) -> torch.Tensor:
    """-log p(x[order[i]] | x[order[:i]]) from a forward over just that prefix."""
    toks = torch.cat([torch.tensor([-1]), idx[order[:i]]])[None]
    pos = torch.cat([torch.tensor([0]), order[:i] + 1])[None]
    target = order[: i + 1][None]
    logits = model.forward_slots(toks, pos, target)[0, -1]
    return -F.log_softmax(logits, -1)[idx[order[i]]]


INJECTIONS = [("sigma", t) for t in TARGET_INJECTIONS if t not in ("none",)] + [("gpt", "none")]


@pytest.mark.parametrize("variant,target", INJECTIONS)
def test_order_loss_is_the_sum_of_prefix_conditionals(variant, target):
    model = tiny(variant, target=target) if target != "adaln" else tiny("aogpt")
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(V, (N,), generator=g)
    orders = [torch.arange(N)] if variant == "gpt" else [torch.randperm(N, generator=g) for _ in range(3)]
    for order in orders:
        _, losses = model(idx[None], order[None])
        expected = torch.stack([prefix_conditional(model, idx, order, i) for i in range(N)])
        torch.testing.assert_close(losses[0], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant,target", INJECTIONS)
def test_later_tokens_never_change_earlier_conditionals(variant, target):
    model = tiny(variant, target=target) if target != "adaln" else tiny("aogpt")
    g = torch.Generator().manual_seed(2)
    idx = torch.randint(V, (N,), generator=g)
    order = torch.arange(N) if variant == "gpt" else torch.randperm(N, generator=g)
    logits, _ = model(idx[None], order[None])
    for k in range(N):  # change the token generated at step k: conditionals at steps <= k stay
        other = idx.clone()
        other[order[k]] = (idx[order[k]] + 1) % V
        logits2, _ = model(other[None], order[None])
        torch.testing.assert_close(logits2[0, : k + 1], logits[0, : k + 1], rtol=0, atol=0)
        if k + 1 < N:
            assert not torch.allclose(logits2[0, k + 1:], logits[0, k + 1:])


def test_orders_differ_but_each_gives_a_normalised_joint():
    """Summing exp(-NLL) over all V^n sequences under one order gives 1 (a proper distribution)."""
    model = tiny("aogpt")
    n = 3
    seqs = torch.tensor(list(itertools.product(range(V), repeat=n)))
    for order in (torch.tensor([2, 0, 1]), torch.tensor([0, 1, 2])):
        _, losses = model(seqs, order.expand(len(seqs), n))
        total = torch.exp(-losses.detach().sum(1)).sum()
        assert math.isclose(float(total), 1.0, rel_tol=1e-10)


def manual_gpt2(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """A plain causal GPT-2 written out by hand (explicit softmax attention, LayerNorm, GELU), fed
    [None] + x[:-1] with positions 0..n-1, reading the model's weights."""
    sd = model.state_dict()
    cfg = model.config
    n = idx.shape[0]
    x = torch.cat([sd["transformer.wnonee.weight"], sd["transformer.wte.weight"][idx[:-1]]])
    x = x + sd["transformer.wpe.weight"][torch.arange(n)]

    def ln(t, pre):
        return F.layer_norm(t, (t.shape[-1],), sd[pre + ".weight"], sd[pre + ".bias"], cfg.norm_eps)

    H, hd = cfg.n_head, cfg.head_dim
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        qkv = h @ sd[p + "attn.c_attn.weight"].T + sd[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(n, H, hd).transpose(0, 1) for t in qkv.split(cfg.n_embd, -1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(n, cfg.n_embd)
        x = x + y @ sd[p + "attn.c_proj.weight"].T + sd[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        h = F.gelu(h @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"])
        x = x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    logits = x @ sd["transformer.wte.weight"].T  # tied head, no bias
    return -F.log_softmax(logits, -1).gather(1, idx[:, None])[:, 0]


def test_gpt_left_to_right_equals_a_hand_written_causal_lm():
    model = tiny("gpt")
    idx = torch.randint(V, (6,), generator=torch.Generator().manual_seed(3))
    _, losses = model(idx[None])
    torch.testing.assert_close(losses[0], manual_gpt2(model, idx), rtol=0, atol=1e-12)


def test_adaln_table_and_direct_paths_agree():
    """adaLN is computed per position and gathered when that is cheaper: same numbers either way."""
    model = tiny("aogpt")
    block = model.transformer.h[0]
    few = torch.tensor([[0, 3]])
    many = torch.tensor([[0, 3, 8, 1, 2, 4, 5, 6, 7, 8, 8, 2]])  # 8 = the "no target" sentinel
    parts = model._adaptive(block, many)  # 12 slots > 9 table rows: table path, one gather per part
    assert len(parts) == 6 and all(p.is_contiguous() for p in parts)
    table_rows = torch.cat(parts, -1)
    for j in range(many.shape[1]):
        direct = model._adaptive(block, many[:, j: j + 1])
        torch.testing.assert_close(table_rows[:, j: j + 1], direct, rtol=0, atol=1e-12)
    assert model._adaptive(block, few).shape == (1, 2, 6 * 16)
    precomputed = model.conditions()  # what a KV cache is set up with
    torch.testing.assert_close(model._adaptive(block, many, precomputed.blocks[0]), table_rows, rtol=0, atol=1e-12)


def test_folded_modulation_equals_the_reference_formula():
    """gate * attn(norm(x) * (1 + scale) + shift) with the norm's weight folded into the table."""
    from aogpt.model import LayerNorm

    model = tiny("aogpt")
    block = model.transformer.h[1]
    for norm in (block.ln_1, LayerNorm(16).double()):
        with torch.no_grad():
            norm.weight.copy_(torch.rand(16, dtype=torch.float64) + 0.5)
            if norm.bias is not None:
                norm.bias.copy_(torch.randn(16, dtype=torch.float64))
        x = torch.randn(5, 16, dtype=torch.float64)
        shift, scale = torch.randn(2, 5, 16, dtype=torch.float64)
        from aogpt.model import fold_affine

        s2, k2 = fold_affine(norm, shift, scale)
        torch.testing.assert_close(torch.addcmul(s2, norm.normalize(x), k2), norm(x) * (1 + scale) + shift)
    none_row = model._adaptive(model.transformer.final_layer, torch.tensor([[8]]))[0, 0]
    lin = model.transformer.final_layer.adaLN_final[1]  # SiLU(0) = 0: only the Linear's bias remains
    shift, scale = lin.bias.chunk(2)
    expected = torch.cat([shift, (1 + scale) * model.transformer.final_layer.ln_f.weight])
    torch.testing.assert_close(none_row, expected, rtol=0, atol=1e-12)


def test_last_slot_has_no_target_and_shapes():
    model = tiny("aogpt")
    idx = torch.randint(V, (2, 5))
    logits, losses = model(idx, with_last_slot=True)
    assert logits.shape == (2, 6, V) and losses.shape == (2, 5)
    logits_short, _ = model(idx)
    torch.testing.assert_close(logits[:, :5], logits_short, rtol=0, atol=1e-12)


def test_select_computes_only_requested_rows():
    model = tiny("aogpt")
    idx = torch.randint(V, (2, 6))
    order = torch.stack([torch.randperm(6) for _ in range(2)])
    tokens, pos, target = model.slots_for_order(idx, order)
    full = model.forward_slots(tokens, pos, target)
    sel = torch.tensor([[1, 4], [0, 5]])
    part = model.forward_slots(tokens, pos, target, select=sel)
    torch.testing.assert_close(part, full.gather(1, sel[..., None].expand(-1, -1, V)), rtol=0, atol=1e-12)


def test_bad_inputs_raise_user_errors():
    model = tiny("gpt")
    with pytest.raises(AOGPTError, match="exceeds the model's block size"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(AOGPTError, match="left to right only"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[2, 1, 0]]))


def test_float32_and_float64_agree():
    torch.manual_seed(0)
    model = Transformer(model_config("aogpt", preset="tiny", vocab_size=64))
    idx = torch.randint(64, (2, 32))
    order = torch.stack([torch.randperm(32) for _ in range(2)])
    l32 = model(idx, order)[1]
    l64 = model.double()(idx, order)[1]
    assert l64.dtype == torch.float64
    torch.testing.assert_close(l32.double(), l64, rtol=0, atol=1e-5)


def test_encoder_forward_sees_every_unmasked_token_and_no_masked_one():
    torch.manual_seed(0)
    model = Transformer(model_config("encoder-mdm", n_layer=2, n_head=2, n_embd=16, block_size=8,
                                     vocab_size=V)).double().eval()
    idx = torch.randint(V, (1, 6))
    mask = torch.tensor([[True, False, True, False, False, True]])
    logits, losses = model(idx, mask=mask)
    assert logits.shape == (1, 6, V)
    torch.testing.assert_close(losses, -F.log_softmax(logits, -1).gather(2, idx[..., None])[..., 0])
    changed = idx.clone()
    changed[0, 0] = (idx[0, 0] + 1) % V  # a masked position's token is invisible
    torch.testing.assert_close(model(changed, mask=mask)[0], logits, rtol=0, atol=0)
    changed = idx.clone()
    changed[0, 4] = (idx[0, 4] + 1) % V  # a visible one changes every position (bidirectional)
    assert not torch.allclose(model(changed, mask=mask)[0][0, 0], logits[0, 0])
    with pytest.raises(AOGPTError):
        model(idx, torch.arange(6)[None])


def test_inference_adaln_table_follows_weight_updates():
    """A forward without a KV cache computes adaLN from the current weights, so an in-place weight
    update (an optimizer step, an EMA update, load_state_dict) is always seen."""
    model = tiny("aogpt")
    idx = torch.randint(V, (2, 6))
    order = torch.stack([torch.randperm(6) for _ in range(2)])
    with torch.no_grad():
        cached = model(idx, order)[0]
    torch.testing.assert_close(cached, model(idx, order)[0].detach(), rtol=0, atol=1e-12)
    with torch.no_grad():
        model.transformer.h[1].adaLN[1].weight.add_(0.5)
        model.transformer.h[0].ln_2.weight.add_(0.25)
        model.transformer.wtpe.weight.mul_(1.5)
        updated = model(idx, order)[0]
    torch.testing.assert_close(updated, model(idx, order)[0].detach(), rtol=0, atol=1e-12)
    assert not torch.allclose(updated, cached)


def test_rmsnorm_custom_backward_matches_autograd():
    from aogpt.model import RMSNorm, _RMSNormFunction

    norm = RMSNorm(24).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(24, dtype=torch.float64) + 0.5)
    x = torch.randn(3, 5, 24, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, 1e-5), (x, norm.weight))
    out = norm(x)
    ref = F.rms_norm(x, (24,), norm.weight, 1e-5)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-15)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, norm.weight), g)
    want = torch.autograd.grad(ref, (x, norm.weight), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant,target", INJECTIONS[:-1])  # every any-order injection
@pytest.mark.parametrize("last", [False, True])
def test_layout_by_target_computes_what_the_slot_layout_computes(variant, target, last):
    """Training and evaluation read any order laid out by target position (`Transformer.forward_by_target`);
    the plain slot layout is the reference: same logits, losses and gradients, batch of several orders
    (one of them left to right)."""
    from aogpt.model import Kernels

    model = tiny(variant, target=target) if target != "adaln" else tiny("aogpt")
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(V, (3, 6), generator=g)
    order = torch.stack([torch.arange(6), torch.randperm(6, generator=g), torch.randperm(6, generator=g)])
    results = []
    for kernels in (Kernels.reference(), Kernels(attention="explicit", by_target=True),
                    Kernels(attention="sdpa", by_target=True)):
        model.kernels = kernels
        model.zero_grad(set_to_none=True)
        logits, losses = model(idx, order, with_last_slot=last)
        (logits.square().mean() + losses.sum()).backward()
        results.append((logits.detach(), losses.detach(), [p.grad.clone() for p in model.parameters()]))
    for logits, losses, grads in results[1:]:
        torch.testing.assert_close(logits, results[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(losses, results[0][1], rtol=0, atol=1e-12)
        for a, b in zip(grads, results[0][2], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    model.kernels = Kernels()
    assert model(idx, order, logits=False)[0] is None  # training asks for the losses only
    torch.testing.assert_close(model(idx, order, logits=False)[1], results[0][1], rtol=0, atol=1e-12)
