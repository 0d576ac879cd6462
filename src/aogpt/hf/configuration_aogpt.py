"""The Hugging Face configuration of an aogpt decoder: `ModelConfig`'s fields as a `PreTrainedConfig`.

Every field of `aogpt.config.ModelConfig` is a field here under the same name (so `config.json`
reads like our own config), plus the Hugging Face names tools look for (``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``max_position_embeddings``) as aliases, the
tokenizer's spec (``tokenizer``: ``gpt2``, ``bpe:N`` or ``bytes``) and its end-of-text id.

This file is copied next to the weights when a model is saved (``auto_map``), so it imports only
`aogpt.config` (the model's own dataclass) and `transformers`.
"""

from __future__ import annotations

import dataclasses

from transformers import PreTrainedConfig

from aogpt.config import ModelConfig, model_config_from_dict

_DEFAULT = ModelConfig()


class AOGPTConfig(PreTrainedConfig):
    """An aogpt decoder (``variant``: gpt, sigma or aogpt) for `AutoModelForCausalLM`."""

    model_type = "aogpt"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "block_size",
    }

    variant: str = _DEFAULT.variant
    n_layer: int = _DEFAULT.n_layer
    n_head: int = _DEFAULT.n_head
    n_embd: int = _DEFAULT.n_embd
    block_size: int = _DEFAULT.block_size
    vocab_size: int = _DEFAULT.vocab_size
    dropout: float = _DEFAULT.dropout
    bias: bool = _DEFAULT.bias
    norm: str = _DEFAULT.norm
    norm_eps: float = _DEFAULT.norm_eps
    qk_norm: bool = _DEFAULT.qk_norm
    target: str = _DEFAULT.target
    target_dim: int = _DEFAULT.target_dim
    tie_head: bool = _DEFAULT.tie_head
    head_bias: bool = _DEFAULT.head_bias
    pos_init: str = _DEFAULT.pos_init
    positions: str = _DEFAULT.positions
    rope_theta: float = _DEFAULT.rope_theta
    mlp: str = _DEFAULT.mlp
    mlp_hidden: int = _DEFAULT.mlp_hidden
    n_kv_head: int = _DEFAULT.n_kv_head
    qkv_bias: bool | None = _DEFAULT.qkv_bias
    mlp_bias: bool | None = _DEFAULT.mlp_bias
    fim_tokens: list[int] | None = _DEFAULT.fim_tokens
    pathway: str = _DEFAULT.pathway  # a gated pathway (aogpt.pathway): the source alone on left-to-right slots
    pathway_rank: int = _DEFAULT.pathway_rank
    tokenizer: str | None = None  # our tokenizer spec: gpt2, bpe:N, bytes or hf (None: no tokenizer saved)
    weights: str | None = None  # which weights of the training run these are: "ema" or "raw"
    training_step: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    tie_word_embeddings: bool = _DEFAULT.tie_head
    use_cache: bool = False  # HF generate() re-reads the whole prefix each step (docs/ecosystem.md)

    def __post_init__(self, **kwargs):
        self.tie_word_embeddings = self.tie_head  # Hugging Face's name for a tied output head
        super().__post_init__(**kwargs)

    @classmethod
    def from_model_config(cls, config: ModelConfig, **extra) -> AOGPTConfig:
        """The Hugging Face config of one of our model configs (``extra``: tokenizer, token ids)."""
        return cls(**dataclasses.asdict(config), **extra)

    def to_model_config(self) -> ModelConfig:
        """Our `ModelConfig` (validated: an unknown variant or a bad field is a clear error)."""
        return model_config_from_dict({f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)})


__all__ = ["AOGPTConfig"]
