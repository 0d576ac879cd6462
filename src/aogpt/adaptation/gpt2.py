"""GPT-2 (`transformers.GPT2LMHeadModel`) as a source: LayerNorm with bias, learned positions,
GELU-tanh, biases everywhere, a tied head; its Conv1D weights are stored (in, out) and transposed."""

from __future__ import annotations

from typing import Any

from aogpt.adaptation.common import our_tokenizer, refuse, start_row
from aogpt.adaptation.source import Source

ACTIVATIONS = {"gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh", "gelu": "gelu"}


def read(model: Any, tokenizer: Any, source: Any) -> Source:
    c = model.config
    if c.activation_function not in ACTIVATIONS:
        refuse(source, f"activation {c.activation_function}")
    if getattr(c, "scale_attn_by_inverse_layer_idx", False) or not getattr(c, "scale_attn_weights", True):
        refuse(source, "a non-standard attention scale")
    sd = model.state_dict()
    state = {name: sd[name] for name in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                         "transformer.ln_f.bias")}
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        for name in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias", "attn.c_proj.bias",
                     "mlp.c_fc.bias", "mlp.c_proj.bias"):
            state[p + name] = sd[p + name]
        for name in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):
            state[p + name] = sd[p + name].t().contiguous()  # Conv1D (in, out) -> Linear (out, in)
    tied = bool(getattr(c, "tie_word_embeddings", True))
    if not tied:
        state["lm_head.weight"] = sd["lm_head.weight"]
    state = {k: v.detach().float().clone() for k, v in state.items()}
    start, note = start_row(model, tokenizer, state["transformer.wte.weight"])
    state["transformer.wnonee.weight"] = start
    backbone = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions - 1,
                    vocab_size=c.vocab_size, dropout=0.0, bias=True, norm="layernorm", norm_eps=c.layer_norm_epsilon,
                    tie_head=tied, head_bias=False, positions="learned", mlp=ACTIVATIONS[c.activation_function],
                    mlp_hidden=c.n_inner or 4 * c.n_embd)
    return Source(kind="GPT2LMHeadModel", backbone=backbone, state=state,
                  tokenizer=our_tokenizer(tokenizer, c.vocab_size, source), start_note=note)
