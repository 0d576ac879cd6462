"""`aogpt.decode`: the kernels compute the same function, the choice keeps row-invariant kernels and is
cached per process, and a fast step equals `Transformer.forward_slots` on every layout.

The generation oracles (cache = recomputation, the chi-square laws, one sample per seed, the server's
batch invariance) run on the fast path too: it is the default of `generate` (tests/generation,
tests/serve); here are the checks of its parts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aogpt import capability
from aogpt.decode import choice as decode_choice
from aogpt.decode.kernels import KINDS, LinearKernel, available
from aogpt.decode.kernels import row_invariant as kernel_row_invariant
from aogpt.decode.layouts import padded_rows, ragged_rows
from aogpt.decode.runner import decode_linears, row_invariant, supports, weight_bytes
from aogpt.inference import for_inference
from aogpt.kv_cache import additive, step_mask
from tests.generation.test_generate import tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_kernel_computes_the_linear_layer_its_gelu_and_its_residual_add(dtype):
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 16, generator=gen).to(dtype), torch.randn(24, generator=gen).to(dtype)
    x, r = torch.randn(5, 16, generator=gen).to(dtype), torch.randn(5, 24, generator=gen).to(dtype)
    kinds = available(dtype, torch.device("cpu"), fused=True)
    assert kinds[-1] == "plain" and set(k.removesuffix("+fused") for k in kinds) <= set(KINDS)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=0)
    with torch.inference_mode():
        for kind in kinds:
            k = LinearKernel(w, b, kind)
            torch.testing.assert_close(k(x), F.linear(x, w, b), **tol)
            torch.testing.assert_close(k.gelu(x), F.gelu(F.linear(x, w, b)), **tol)
            torch.testing.assert_close(k.gelu(x, "tanh"), F.gelu(F.linear(x, w, b), approximate="tanh"), **tol)
            torch.testing.assert_close(k.add(x, r), r + F.linear(x, w, b), **tol)


def test_the_row_invariance_check_tells_one_from_the_other():
    w = torch.randn(4, dtype=torch.float64)
    assert kernel_row_invariant(lambda x: x * w + 1, 4, torch.float64, torch.device("cpu"))
    # a "kernel" whose result depends on how many rows come with it
    assert not kernel_row_invariant(lambda x: x * w + x.shape[0] * 1e-9, 4, torch.float64, torch.device("cpu"))


def test_the_choice_is_measured_once_and_keeps_row_invariant_kernels():
    decode_choice.forget()
    shapes = decode_choice.Shapes(32, 128, 64, 2, 16, 34)
    first = decode_choice.choose(shapes, torch.float32, torch.device("cpu"))
    assert decode_choice.choose(shapes, torch.float32, torch.device("cpu")) is first  # cached for the process
    assert set(first.linear) == set(decode_choice.ROLES) and first.attention in ("sdpa", "matmul")
    for role, kind in first.linear.items():
        tried = {k: us for k, us in first.linear_us.items() if k.startswith(role + "/")}
        usable = {k: us for k, us in tried.items() if first.invariant[k]} or tried
        assert first.linear_us[f"{role}/{kind}"] == min(usable.values())  # the fastest of the eligible
    assert first.row_invariant == all(first.invariant[f"{r}/{k}"] for r, k in first.linear.items())
    assert first.describe().endswith(f"({capability.cpu_class()})")
    f64 = decode_choice.choose(shapes, torch.float64, torch.device("cpu"))
    assert set(f64.linear.values()) == {"plain"} and f64.store == torch.float64 and not f64.linear_us


def test_an_avx2_cpu_chooses_among_its_own_kernels(as_cpu):
    if capability.cpu().arch != "x86":
        pytest.skip("the avx2 class is an x86 class")
    as_cpu("avx2")
    decode_choice.forget()
    c = decode_choice.choose(decode_choice.Shapes(32, 128, 64, 2, 16, 34), torch.bfloat16, torch.device("cpu"))
    assert set(c.linear.values()) == {"plain"}  # no bf16 packing, no bf16 MKL on that class
    assert c.cpu_class == "avx2"
    decode_choice.forget()


def llama_like(dtype: torch.dtype = torch.float32):
    """A model with rotary positions, grouped-query attention, QK-norm, SwiGLU and RMSNorm: the blocks
    the fast path reaches through the model's own forward like any other."""
    from aogpt.config import model_config
    from aogpt.model import Transformer

    torch.manual_seed(0)
    model = Transformer(model_config("gpt", n_layer=2, n_head=4, n_kv_head=2, n_embd=16, block_size=10,
                                     vocab_size=13, positions="rotary", mlp="swiglu", norm="rmsnorm", qk_norm=True))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.to(dtype).eval()


def _step_inputs(layout: str, B: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """A decode step after six prefilled columns: two rows per sequence (a catch-up and a query) as a
    (B, 2) block, or ragged rows (2, 0, 1 per sequence) bucketed by width or padded."""
    if layout == "uniform":
        tokens = torch.randint(0, 13, (B, 2), generator=gen)
        pos = torch.tensor([[7, 7]]).expand(B, 2)
        tgt = torch.tensor([[7, 9]]).expand(B, 2)
        mask = additive(step_mask(torch.tensor([6, 7]), 7, 8)[None, None], torch.float32)
        return tokens, pos, tgt, dict(attn_mask=mask, cache_pos=6)
    sizes, first, decided = np.array([2, 0, 1]), np.array([6, 6, 6]), np.array([7, 6, 6])
    b, col, where = ragged_rows(sizes, first, decided, torch.float32, torch.device("cpu"))
    mask = None
    if layout == "padded":
        b, col, where, mask = padded_rows(sizes, first, decided, torch.float32, torch.device("cpu"))
    R = len(b)
    tokens = torch.randint(0, 13, (1, R), generator=gen)
    pos = torch.from_numpy(col + 1)[None]
    tgt = torch.from_numpy(col + 2)[None]
    return tokens, pos, tgt, dict(attn_mask=mask, cache_pos=where)


@pytest.mark.parametrize("variant", ["aogpt", "sigma", "gpt", "llama-like"])
@pytest.mark.parametrize("layout", ["uniform", "buckets", "padded"])
def test_the_fast_path_is_the_models_forward_with_its_kernels(variant, layout):
    """The same step through the fast path (the model's forward with the measured kernels swapped in)
    and through the model itself with torch's linear layers (each with its own cache, prefilled
    alike): logits and the keys written agree to float32 rounding, on every layout and block kind."""
    model = llama_like() if variant == "llama-like" else \
        tiny_model(variant, vocab=13, block=10, n_embd=16, n_layer=2, dtype=torch.float32)
    fast = for_inference(model)
    assert fast is not model and supports(model) and list(fast.parameters()) == list(model.parameters())
    if capability.can_pack(torch.float32):  # the copy holds the measured kernels, the model its own layers
        assert all(isinstance(m, LinearKernel) for m in decode_linears(fast).values())
    assert all(isinstance(m, torch.nn.Linear) for m in decode_linears(model).values())
    B = 3
    gen = torch.Generator().manual_seed(1)
    mine, ref = fast.setup_cache(B, 11), model.setup_cache(B, 11, attention="sdpa")
    with torch.inference_mode():
        for cache in (mine, ref):  # prefill six columns
            tokens = torch.randint(0, 13, (B, 6), generator=torch.Generator().manual_seed(2))
            pos = torch.arange(6).expand(B, 6)
            tgt = torch.arange(1, 7).expand(B, 6)
            (fast if cache is mine else model).forward_slots(tokens, pos, tgt, cache=cache, cache_pos=0)
        tokens, pos, tgt, kw = _step_inputs(layout, B, gen)
        got = fast.forward_slots(tokens, pos, tgt, cache=mine, **kw)
        want = model.forward_slots(tokens, pos, tgt, cache=ref, **kw)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(mine.k, ref.k, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(mine.v, ref.v, atol=2e-5, rtol=2e-5)
    assert weight_bytes(fast) > 0


@pytest.mark.parametrize("variant", ["aogpt", "llama-like"])
def test_a_cache_step_is_the_forward_over_the_whole_sequence(variant):
    """Independent of any decode code: slots written to the cache in three forwards (a prefix, a
    (B, 2) block, then packed ragged rows) give the logits one forward over all slots gives (float64)."""
    model = llama_like(torch.float64) if variant == "llama-like" else \
        tiny_model(variant, vocab=13, block=10, n_embd=16, n_layer=2)
    B, n = 3, 9
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 13, (B, n), generator=gen)
    pos = torch.stack([torch.randperm(n, generator=gen) for _ in range(B)]) + 1
    tgt = torch.randint(0, 10, (B, n), generator=gen)
    with torch.inference_mode():
        whole = model.forward_slots(tokens, pos, tgt)
        fast = for_inference(model)
        cache = fast.setup_cache(B, n + 1)

        def causal(cols: list[int]) -> torch.Tensor:
            return additive(step_mask(torch.tensor(cols), cols[-1] + 1, cols[-1] + 1)[None, None], torch.float64)

        first = fast.forward_slots(tokens[:, :5], pos[:, :5], tgt[:, :5], cache=cache, cache_pos=0,
                                   attn_mask=causal([0, 1, 2, 3, 4]))
        block = fast.forward_slots(tokens[:, 5:7], pos[:, 5:7], tgt[:, 5:7], cache=cache, cache_pos=5,
                                   attn_mask=causal([5, 6]))
        sizes, start = np.array([2, 1, 2]), np.array([7, 7, 7])
        b, col, where = ragged_rows(sizes, start, start + sizes, torch.float64, torch.device("cpu"))
        rows = fast.forward_slots(tokens[b, col][None], pos[b, col][None], tgt[b, col][None], cache=cache,
                                  cache_pos=where)
    torch.testing.assert_close(first, whole[:, :5], atol=1e-10, rtol=0)
    torch.testing.assert_close(block, whole[:, 5:7], atol=1e-10, rtol=0)
    torch.testing.assert_close(rows[0], whole[b, col], atol=1e-10, rtol=0)


def test_the_runner_checks_its_own_kernels_as_the_choice_did():
    model = tiny_model("aogpt", vocab=32, block=10, dtype=torch.float32)
    fast = for_inference(model)
    assert row_invariant(fast) == fast.decode_choice.row_invariant  # the actual weights, the same shapes


def test_a_gpu_model_keeps_its_own_layers():
    """Nothing to choose on a GPU: the fast path is the model itself there (its steps are captured as
    CUDA graphs instead); a meta-device model stands in for one without a GPU."""
    from aogpt.config import model_config
    from aogpt.model import Transformer

    with torch.device("meta"):
        model = Transformer(model_config("gpt", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=16))
    assert not supports(model) and for_inference(model) is model


def test_the_preferred_candidate_is_the_first_within_the_margin():
    assert decode_choice.preferred({"sdpa": 100.0, "matmul": 97.0}) == "sdpa"  # 3% is noise here
    assert decode_choice.preferred({"sdpa": 100.0, "matmul": 90.0}) == "matmul"
    c = decode_choice.choose(decode_choice.Shapes(32, 128, 64, 2, 16, 34), torch.float32, torch.device("cpu"))
    assert c.layout in ("runs", "buckets", "padded") and set(c.layout_us) == {"runs", "buckets", "padded"}
    assert c.layout == decode_choice.preferred(c.layout_us)
