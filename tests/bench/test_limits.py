"""`aogpt.bench.limits`: the machine's matmul rate and the FLOPs a step's matrix products need."""

from __future__ import annotations

import torch

from aogpt.bench.limits import counted_matmul_flops, faster_of, matmul_rate, model_shapes


def test_matmul_rate_reports_every_shape_and_the_fastest_as_best():
    shapes = [(64, 32, 48), (32, 64, 16)]
    rate = matmul_rate(shapes, torch.float32, torch.device("cpu"), repeats=2, min_seconds=0.001)
    assert set(rate["rates"]) == {"64x32x48", "32x64x16"}
    assert all(r > 0 for r in rate["rates"].values())
    assert rate["best"] == max(rate["rates"].values()) and rate["dtype"] == "float32"


def test_faster_of_keeps_each_shapes_faster_measurement():
    first = {"dtype": "bfloat16", "rates": {"a": 1.0, "b": 5.0}, "best": 5.0}
    second = {"dtype": "bfloat16", "rates": {"a": 3.0, "b": 2.0}, "best": 3.0}
    merged = faster_of(first, second)
    assert merged["rates"] == {"a": 3.0, "b": 5.0} and merged["best"] == 5.0 and merged["dtype"] == "bfloat16"


def test_counted_flops_of_a_linear_layer_forward_and_backward():
    m, k, n = 8, 6, 4
    layer = torch.nn.Linear(k, n, bias=False)
    x = torch.randn(m, k, requires_grad=True)
    assert counted_matmul_flops(lambda: layer(x)) == 2 * m * k * n
    # backward: the input's and the weight's gradients, one product each of the same size
    assert counted_matmul_flops(lambda: layer(x).sum().backward()) == 3 * 2 * m * k * n


def test_model_shapes_are_the_projections_and_the_mlp():
    assert model_shapes(2048, 192) == [(2048, 192, 576), (2048, 192, 768), (2048, 768, 192)]
