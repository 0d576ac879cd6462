"""`aogpt.attention`: every kernel computes exact attention (against float64, written out here), for
each kind of mask the model uses; `auto`'s rule; the additive mask made once per forward."""

from __future__ import annotations

import pytest
import torch

from aogpt.attention import KERNELS, AttentionMask, attend, causal_bias, choose_kernel
from aogpt.errors import AOGPTError


def reference(q, k, v, allowed):
    """softmax(q k^T / sqrt(d) masked) v in float64, written out: the independent computation."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


def masks(B, S, L, gen):
    causal = torch.ones(S, L, dtype=torch.bool).tril(L - S)
    rank = torch.stack([torch.randperm(S, generator=gen) for _ in range(B)])
    order = (rank[:, None, :] <= rank[:, :, None]).unsqueeze(1) if S == L else None
    step = torch.zeros(B, 1, S, L, dtype=torch.bool)
    step[..., : L - S] = True
    step[..., L - S:] = torch.eye(S, dtype=torch.bool)
    return {"causal": causal, "order": order, "step": step}


@pytest.mark.parametrize("kind", [k for k in KERNELS if k != "auto"])
@pytest.mark.parametrize("mask_kind", ["causal", "order", "step", "order-object"])
@pytest.mark.parametrize("S,L", [(7, 7), (3, 9)])
def test_every_kernel_is_exact_attention(kind, mask_kind, S, L):
    gen = torch.Generator().manual_seed(S * 31 + L)
    B, H, D = 2, 3, 8
    q = torch.randn(B, H, S, D, generator=gen)
    k, v = torch.randn(B, H, L, D, generator=gen), torch.randn(B, H, L, D, generator=gen)
    all_masks = masks(B, S, L, gen)
    name = mask_kind.removesuffix("-object")
    if all_masks[name] is None:
        pytest.skip("an any-order mask is square")
    allowed = all_masks[name]
    expected = reference(q, k, v, allowed.expand(B, 1, S, L))
    if mask_kind == "causal":
        out = attend(q, k, v, None, causal=True, kind=kind) if S == L else attend(q, k, v, allowed, kind=kind)
    elif mask_kind == "order-object":
        out = attend(q, k, v, AttentionMask(allowed), kind=kind)
    else:
        out = attend(q, k, v, allowed, kind=kind)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["sdpa", "explicit"])
def test_gradients_match_float64(kind):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    allowed = masks(2, 6, 6, gen)["order"]
    assert torch.autograd.gradcheck(lambda q, k, v: attend(q, k, v, AttentionMask(allowed), kind=kind), (q, k, v))


def test_bf16_kernels_stay_close_to_float64():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 3, 32, 16, generator=gen) for _ in range(3))
    expected = reference(q, k, v, torch.ones(32, 32, dtype=torch.bool).tril())
    for kind in ("sdpa", "explicit", "sdpa-fp32"):
        out = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True, kind=kind)
        assert out.dtype == torch.bfloat16
        assert (out.double() - expected).abs().max() < 0.05, kind


def test_auto_picks_by_device_and_precision():
    cpu = torch.device("cpu")
    assert choose_kernel(cpu, torch.bfloat16) == "explicit" and choose_kernel(cpu, torch.float16) == "explicit"
    assert choose_kernel(cpu, torch.float32) == "sdpa" and choose_kernel(torch.device("cuda"), torch.bfloat16) == "sdpa"


def test_the_additive_mask_is_made_once_per_dtype():
    allowed = torch.tensor([[True, False], [True, True]])
    mask = AttentionMask(allowed)
    first = mask.additive(torch.float32)
    assert mask.additive(torch.float32) is first
    assert first[0, 1] == float("-inf") and first[1, 0] == 0
    assert causal_bias(2, 3, torch.device("cpu"), torch.float32).tolist() == [[0, 0, float("-inf")], [0, 0, 0]]


def test_dropout_applies_to_the_weights_in_training_only():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 5, 4, generator=gen) for _ in range(3))
    plain = attend(q, k, v, causal=True, kind="explicit")
    torch.manual_seed(0)
    dropped = attend(q, k, v, causal=True, dropout=0.5, kind="explicit")
    assert not torch.allclose(plain, dropped)


def test_unknown_kernel_is_refused():
    from aogpt.attention import check_kernel

    with pytest.raises(AOGPTError, match="unknown attention kernel"):
        check_kernel("fastest")
