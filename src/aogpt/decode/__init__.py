"""The decode path: the model's own forward for small steps, with kernels and layouts chosen by measurement.

A decode step multiplies 8-32 rows by every weight matrix and attends a few queries per sequence
over the KV cache. Such a step is bound by the bytes it reads (the weights and the cache), not by
arithmetic, and in eager PyTorch by the number of operations it launches. The forward itself is
written once, in `aogpt.model` (every caller, training included, goes through
`Transformer.forward_slots`); this package decides how a step computes it:

- `aogpt.decode.kernels`: the linear kernels a step may use (oneDNN with a weight packed once, the
  one place a weight is packed, with the GELU or the residual add fused in; MKL on a transposed
  copy; torch's default), swapped into the model's layers (`aogpt.backbone.FusedLinear`);
- `aogpt.decode.choice`: which kernel is fastest per CPU class, precision and model shape, among
  those that give a row the same bits whatever the number of rows (what makes a served request
  equal to offline generation), plus the attention kernel, the dtype the cache keeps and the layout
  of a ragged step; measured once per process and cached, like `aogpt.generation.precision`;
- `aogpt.decode.layouts`: how a Lemma 4.1 step's rows meet the cache in attention (by width, by run
  of the sequences taking part, or padded; and the static shapes of a captured step);
- `aogpt.decode.runner`: `prepare`, the model with the measured kernels swapped in (a structural copy
  sharing every parameter);
- `aogpt.decode.gated`: a gated model's delta layers (`aogpt.pathway`) as two kernels, the source's
  weight for the rows that read left to right and the merged W + dW for the others;
- `aogpt.decode.graphs`: on a GPU, the steps captured as CUDA graphs, one per static shape.

`aogpt.inference.for_inference(model)` builds the fast path (``path="reference"``: the model itself,
torch's own layers), which `aogpt bench generate` times side by side (docs/generation.md, "Decode paths").
"""
