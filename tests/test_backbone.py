"""`aogpt.backbone`'s fused CPU norms against autograd through the plain formulas (float64)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aogpt.backbone import head_rms_norm, modulated_rms_norm


def test_head_norm_is_rms_norm_with_the_heads_moved_to_the_front():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(8, dtype=torch.float64) + 0.5).requires_grad_()
    out = head_rms_norm(x, w, 1e-5)
    assert out.shape == (2, 3, 5, 8) and out.is_contiguous()
    torch.testing.assert_close(out, F.rms_norm(x, (8,), w, 1e-5).transpose(1, 2), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, b: head_rms_norm(a, b, 1e-5), (x, w))


@pytest.mark.parametrize("rows", [1, 3])  # one row per position broadcast over the batch, or one per slot
def test_modulated_norm_is_the_adaln_formula(rows):
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(rows, 5, 8, dtype=torch.float64, requires_grad=True)
    scale = torch.randn(rows, 5, 8, dtype=torch.float64, requires_grad=True)
    want = F.rms_norm(x, (8,), None, 1e-5) * scale + shift
    torch.testing.assert_close(modulated_rms_norm(x, shift, scale, 1e-5), want, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, b, c: modulated_rms_norm(a, b, c, 1e-5), (x, shift, scale))


def test_modulated_norm_writes_the_autocast_dtype_for_the_next_matrix_product():
    x, shift, scale = torch.randn(2, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = modulated_rms_norm(x, shift, scale, 1e-5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.rms_norm(x, (8,), None, 1e-5) * scale + shift, atol=0.05, rtol=0.01)
