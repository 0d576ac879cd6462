"""`AOGPTForCausalLM`: our decoder (`aogpt.model.Transformer`) as a Hugging Face causal language model.

The wrapper holds the `Transformer` as ``.model`` with the same weights (``model.<our name>`` in
``model.safetensors``), so everything in aogpt accepts it as it is: ``aogpt.evaluate(hf_model, ...)``,
``aogpt.generate(hf_model, ...)`` (any-order generation and infilling with the KV-cache generator).

What ``forward`` computes (docs/ecosystem.md). Our decoder reads a sequence after a learned start
slot, each slot told which position it must predict next (docs/design.md). The wrapper reads
``input_ids`` left to right by default, or in ``order`` (a permutation of the positions, for
sigma-GPT and AO-GPT), and returns Hugging Face's next-token layout:

* ``logits[:, i]`` is the distribution of the token read after the first i + 1 tokens of the order:
  of ``input_ids[:, order[i + 1]]`` for i < n - 1, and of position n (the continuation) for the last
  row, so ``generate()`` works as for any causal LM;
* ``loss`` (with ``labels``, usually ``input_ids``; -100 ignored) is the mean of
  -log p(label at each position | the tokens read before it) over *every* position, the first one
  included: the start slot predicts it, where a Hugging Face GPT-2 has no prediction and skips it.
  Set ``labels[:, 0] = -100`` for GPT-2's convention. ``loss * number of labels`` is the exact
  negative log-likelihood of the sequence under the order (`aogpt.evaluate` computes the same).

Padding (``attention_mask`` zeros, left or right) is supported for left-to-right reading. The
encoder-only MDM is not a causal language model and is refused. Hugging Face's ``generate()``
re-reads the whole prefix at every step (no cache: our KV cache keys slots by the position they
predict next, a different contract from Hugging Face's caches); fast sampling in any order is
`aogpt_generate`.

This file is copied next to the weights when a model is saved (``auto_map``); it imports
`aogpt`, so ``trust_remote_code=True`` loading needs aogpt installed (not imported).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.functional import token_nll
from aogpt.model import Transformer
from aogpt.orders import check_permutation

from .configuration_aogpt import AOGPTConfig


class AOGPTPreTrainedModel(PreTrainedModel):
    config_class = AOGPTConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing to do: our `Transformer` initialises itself (GPT-2 init, adaLN-Zero) when built."""


class AOGPTForCausalLM(AOGPTPreTrainedModel, GenerationMixin):
    """An aogpt decoder (gpt, sigma or aogpt) with Hugging Face's causal-LM interface."""

    _tied_weights_keys = {"model.lm_head.weight": "model.transformer.wte.weight"}

    def __init__(self, config: AOGPTConfig):
        super().__init__(config)
        model_config = config.to_model_config()
        if not family(model_config.variant).causal:
            raise AOGPTError(f"variant {model_config.variant} is a bidirectional encoder, not a causal language model",
                             "export a gpt, sigma or aogpt model; load the encoder with aogpt.load")
        self.model = Transformer(model_config)
        self.post_init()

    # ------------------------------------------------------------------ Hugging Face plumbing
    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.transformer.wte

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The whole prefix at every step (no cache): see the module docstring."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, order: torch.Tensor | list[int] | None = None,
                num_items_in_batch: int | torch.Tensor | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> CausalLMOutput | tuple:
        """Next-token logits (B, n, V) of `input_ids` read left to right, or in `order` ((n,) or
        (B, n)); with `labels`, the mean NLL of every labelled position (module docstring).
        ``num_items_in_batch`` (Hugging Face's Trainer) divides the summed NLL instead of the count."""
        if kwargs.get("past_key_values") is not None:
            raise AOGPTError("this model keeps no Hugging Face cache",
                             "call it with the whole prefix (use_cache=False)")
        cfg = self.model.config
        B, n = input_ids.shape
        if n > cfg.block_size:
            raise AOGPTError(f"{n} tokens exceed the model's context of {cfg.block_size}",
                             f"pass at most {cfg.block_size} tokens (max_length in generate())")
        padded = attention_mask is not None and not bool(attention_mask.bool().all())
        if order is not None:
            if padded:
                raise AOGPTError("padding works with left-to-right reading only", "pass unpadded sequences with order")
            order = check_permutation(order, n, rows=B).to(input_ids.device).expand(B, n)
            family(cfg.variant).check_order(order)
        slots, attn_mask, predictor = (self._padded_slots(input_ids, attention_mask.bool()) if padded
                                       else self._order_slots(input_ids, order))
        all_logits = self.model.forward_slots(*slots, attn_mask=attn_mask)  # (B, n + 1, V): the start slot first
        loss = None
        if labels is not None:
            if padded:
                labels = labels.masked_fill(~attention_mask.bool(), -100)
            loss = self._loss(all_logits, labels, predictor, num_items_in_batch)
        logits = all_logits[:, 1:]
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return CausalLMOutput(loss=loss, logits=logits)

    def _order_slots(self, input_ids: torch.Tensor, order: torch.Tensor | None):
        """Slots of the sequence read in `order` (default left to right), the last slot told to
        predict the continuation position n; and, per position, the slot that predicts it."""
        B, n = input_ids.shape
        if order is None:
            order = torch.arange(n, device=input_ids.device).expand(B, n)
        tokens, pos, target = self.model.slots_for_order(input_ids, order, with_last_slot=True)
        target = target.clone()
        target[:, n] = min(n, self.model.config.block_size)  # the continuation (block_size: none)
        predictor = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=order.device).expand(B, n))
        return (tokens, pos, target), None, predictor

    def _padded_slots(self, input_ids: torch.Tensor, real: torch.Tensor):
        """Left-to-right slots of padded rows: each row's real tokens get positions 0, 1, ... in
        their order, pad slots are never attended to, and each position is predicted by the slot of
        the real token before it (the start slot for the first)."""
        B, n = input_ids.shape
        device = input_ids.device
        count = real.long().cumsum(1)  # real tokens up to and including each column
        position = (count - 1).clamp(min=0)
        limit = self.model.config.block_size
        tokens = torch.cat([torch.full((B, 1), -1, dtype=input_ids.dtype, device=device), input_ids], 1)
        pos = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=device), position + 1], 1)
        target = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=device), (position + 1).clamp(max=limit)], 1)
        keys = torch.cat([torch.ones((B, 1), dtype=torch.bool, device=device), real], 1)
        causal = torch.ones(n + 1, n + 1, dtype=torch.bool, device=device).tril()
        attn_mask = (causal[None] & keys[:, None, :])[:, None]
        slot_of_real = torch.where(real, torch.arange(1, n + 1, device=device), 0)
        predictor = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=device),
                               slot_of_real.cummax(1).values[:, :-1]], 1)
        return (tokens, pos, target), attn_mask, predictor

    @staticmethod
    def _loss(all_logits: torch.Tensor, labels: torch.Tensor, predictor: torch.Tensor,
              num_items_in_batch: int | torch.Tensor | None) -> torch.Tensor:
        keep = labels != -100
        rows = all_logits.gather(1, predictor.unsqueeze(-1).expand(-1, -1, all_logits.shape[-1]))
        nll = token_nll(rows, labels.clamp(min=0)).masked_fill(~keep, 0.0).sum()
        return nll / (num_items_in_batch if num_items_in_batch is not None else keep.sum().clamp(min=1))

    # ------------------------------------------------------------------ our generator
    def aogpt_generate(self, tokenizer: Any = None, **kwargs: Any) -> Any:
        """Sample with aogpt's KV-cache generator, in any order for sigma and AO-GPT: the arguments of
        `aogpt.generation.generate.generate` (prompt, length, order, steps, temperature, ...)."""
        from aogpt.generation.generate import generate

        return generate(self.model, tokenizer=tokenizer, **kwargs)

    def aogpt_infill(self, template: Any, tokenizer: Any = None, **kwargs: Any) -> Any:
        """Fill the blanks of a template (`aogpt.generation.generate.infill`)."""
        from aogpt.generation.generate import infill

        return infill(self.model, template, tokenizer=tokenizer, **kwargs)


AOGPTConfig.register_for_auto_class()
AOGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["AOGPTForCausalLM", "AOGPTPreTrainedModel"]
