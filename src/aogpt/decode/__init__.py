"""The decode path built for small steps: a few rows per sequence through every weight, against the cache.

A decode step multiplies 8-32 rows by every weight matrix and attends a few queries per sequence
over the KV cache. Such a step is bound by the bytes it reads (the weights and the cache), not by
arithmetic, and in eager PyTorch by the number of operations it launches. This package holds the
path that does the least of both, and chooses its kernels by measuring them on the machine at hand:

- `aogpt.decode.kernels`: the linear kernels a step may use (oneDNN with a weight packed once and
  the GELU or the residual add fused in; MKL on a transposed copy; torch's default), with the same
  call shape, so the runner does not care which one it holds;
- `aogpt.decode.choice`: which kernel is fastest per CPU class, precision and model shape, among
  those that give a row the same bits whatever the number of rows (what makes a served request
  equal to offline generation), plus the attention kernel and the dtype the cache keeps; measured
  once per process and cached, like `aogpt.generation.precision`;
- `aogpt.decode.runner`: `SmallStepModel`, a model's inference form for cache steps: rows (R, d)
  from the embedding to the head, fused q/k/v, the keys and values written with one copy per layer,
  the attention scale folded into the query weights, adaLN tables stacked into one lookup per step;
- `aogpt.decode.gated`: `GatedStepModel`, the same for a model with a gated pathway (`aogpt.pathway`):
  the source's kernels for the rows that read left to right, W + dW's for the others.

`aogpt.inference.for_inference(model, path="fast")` builds it; ``path="reference"`` keeps the
previous path (modules with oneDNN-packed weights, torch's SDPA per run of sequences), which
`aogpt bench generate` times side by side (docs/generation.md, "Decode paths").
"""
