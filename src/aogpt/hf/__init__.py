"""aogpt in the Hugging Face ecosystem (the ``hf`` extra: ``transformers`` and ``lm-eval``).

Importing this package registers ``model_type`` "aogpt" with `AutoConfig` and
`AutoModelForCausalLM`, so ``from_pretrained`` loads exported folders. See docs/ecosystem.md.

    configuration_aogpt   AOGPTConfig: our ModelConfig as a PreTrainedConfig
    modeling_aogpt        AOGPTForCausalLM: our decoder as a causal LM (exact left-to-right logits)
    tokenization          our tokenizers as Hugging Face tokenizers
    export                to_hf / export_hf: a checkpoint as a from_pretrained folder
    harness               the lm-evaluation-harness model "aogpt" (imported on demand: lm-eval is slow)
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from aogpt.hf.configuration_aogpt import AOGPTConfig
from aogpt.hf.export import export_hf, to_hf
from aogpt.hf.modeling_aogpt import AOGPTForCausalLM
from aogpt.hf.tokenization import to_hf_tokenizer

AutoConfig.register(AOGPTConfig.model_type, AOGPTConfig, exist_ok=True)
AutoModelForCausalLM.register(AOGPTConfig, AOGPTForCausalLM, exist_ok=True)

__all__ = ["AOGPTConfig", "AOGPTForCausalLM", "export_hf", "to_hf", "to_hf_tokenizer"]
