"""The Llama family as a source (`LlamaForCausalLM`, `Qwen2ForCausalLM`; SmolLM2 is a Llama):
RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases (Qwen2: biases on q, k, v).
q, k and v become our fused ``c_attn`` = [q; k; v]; gate and up our ``c_fc`` = [gate; up]."""

from __future__ import annotations

from typing import Any

import torch

from aogpt.adaptation.common import our_tokenizer, refuse, start_row
from aogpt.adaptation.source import Source


def rope_theta(config: Any, source: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    scaling = getattr(config, "rope_scaling", None)
    if kind != "default" or (isinstance(scaling, dict) and scaling.get("rope_type", "default") != "default"):
        refuse(source, f"rotary scaling {kind!r}", "adapt a model with plain rotary positions")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", 10000.0))


def read(model: Any, tokenizer: Any, source: Any) -> Source:
    c = model.config
    kind = type(model).__name__
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    if c.hidden_act != "silu":
        refuse(source, f"activation {c.hidden_act}")
    if getattr(c, "head_dim", None) not in (None, c.hidden_size // heads):
        refuse(source, f"a head size of {c.head_dim} (not hidden_size / heads)")
    if getattr(c, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(c, "layer_types", None)
                                                     or []):
        refuse(source, "sliding-window attention")
    qwen = kind == "Qwen2ForCausalLM"
    attn_bias = bool(getattr(c, "attention_bias", False))
    mlp_bias = bool(getattr(c, "mlp_bias", False))
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    state = {"transformer.wte.weight": sd["model.embed_tokens.weight"],
             "transformer.ln_f.weight": sd["model.norm.weight"]}
    for i in range(c.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"transformer.h.{i}."
        a = src + "self_attn."
        state[dst + "ln_1.weight"] = sd[src + "input_layernorm.weight"]
        state[dst + "ln_2.weight"] = sd[src + "post_attention_layernorm.weight"]
        state[dst + "attn.c_attn.weight"] = torch.cat([sd[a + f"{p}_proj.weight"] for p in "qkv"])
        if qwen or attn_bias:
            state[dst + "attn.c_attn.bias"] = torch.cat([sd[a + f"{p}_proj.bias"] for p in "qkv"])
        state[dst + "attn.c_proj.weight"] = sd[a + "o_proj.weight"]
        if attn_bias:
            state[dst + "attn.c_proj.bias"] = sd[a + "o_proj.bias"]
        m = src + "mlp."
        state[dst + "mlp.c_fc.weight"] = torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]])
        state[dst + "mlp.c_proj.weight"] = sd[m + "down_proj.weight"]
        if mlp_bias:
            state[dst + "mlp.c_fc.bias"] = torch.cat([sd[m + "gate_proj.bias"], sd[m + "up_proj.bias"]])
            state[dst + "mlp.c_proj.bias"] = sd[m + "down_proj.bias"]
    tied = bool(getattr(c, "tie_word_embeddings", False))
    if not tied:
        state["lm_head.weight"] = sd["lm_head.weight"]
    state = {k: v.clone().contiguous() for k, v in state.items()}
    start, note = start_row(model, tokenizer, state["transformer.wte.weight"])
    state["transformer.wnonee.weight"] = start
    backbone = dict(n_layer=c.num_hidden_layers, n_head=heads, n_embd=c.hidden_size,
                    block_size=c.max_position_embeddings - 1, vocab_size=c.vocab_size, dropout=0.0, bias=attn_bias,
                    qkv_bias=qwen or attn_bias, mlp_bias=mlp_bias, norm="rmsnorm", norm_eps=c.rms_norm_eps,
                    tie_head=tied, head_bias=False, positions="rotary", rope_theta=rope_theta(c, source), mlp="swiglu",
                    mlp_hidden=c.intermediate_size, n_kv_head=kv if kv != heads else 0)
    return Source(kind=kind, backbone=backbone, state=state, tokenizer=our_tokenizer(tokenizer, c.vocab_size, source),
                  start_note=note)
