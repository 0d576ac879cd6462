"""The lm-evaluation-harness model "aogpt": exact likelihoods of our decoders (docs/ecosystem.md).

Importing this module registers the model with `lm_eval` (so ``model="aogpt"`` works in
``lm_eval.simple_evaluate``); `aogpt harness` imports it for you. It is imported on demand only:
lm-eval takes seconds to import.

* ``loglikelihood``: log p(continuation | context), exact left to right (default) or the any-order
  bound with K orders (``order=random,K=8``), `aogpt.hf.scoring.score_continuations`. Contexts and
  continuations are split into tokens as the harness's own models do: the context's trailing spaces
  move to the continuation, the whole text is encoded and split after the context's tokens.
  An empty context is the start of a text (our start slot), not an end-of-text token.
* ``loglikelihood_rolling``: log p(document), in windows of the model's context
  (`aogpt.hf.scoring.score_documents`); exact left to right.
* ``generate_until``: continuation of the context with our KV-cache generator, one token per step,
  left to right by default (``gen_order=random`` for sigma and AO-GPT), greedy unless the task asks
  to sample; the text is cut at the first stop string (and at ``<|endoftext|>``).

Model arguments (``--model_args`` / `AOGPTLM`): ``pretrained`` (a run, checkpoint or exported
folder), ``weights`` (ema|raw), ``order`` (l2r|random), ``K`` (orders for the bound, default 8),
``batch_size``, ``device``, ``seed``, ``gen_order``, ``max_gen_toks``. In Python, ``model=`` takes a
loaded model instead (`aogpt.load`'s result, or a `Transformer` with ``tokenizer=``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from aogpt.checkpoint import load
from aogpt.data.tokenizer import EOT_TEXT
from aogpt.errors import AOGPTError
from aogpt.families import unwrap
from aogpt.hf.scoring import Score, reading_mode, score_continuations, score_documents, score_infill
from aogpt.progress import progress
from aogpt.seeds import draw_seed

SAMPLING_KEYS = {"until", "max_gen_toks", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p"}


def split_pair(encode: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of a (context, continuation) request, split as lm-eval's own models split them."""
    if not context:
        return [], list(encode(continuation))
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = list(encode(context + continuation))
    context_ids = list(encode(context))
    return context_ids, whole[len(context_ids):]


@register_model("aogpt")
class AOGPTLM(LM):
    """Our decoders in lm-evaluation-harness (module docstring)."""

    def __init__(self, pretrained: str | None = None, *, model: Any = None, tokenizer: Any = None,
                 weights: str = "ema", order: str = "l2r", K: int = 8, batch_size: Any = 16,
                 device: str | None = None, seed: int = 0, gen_order: str = "l2r", max_gen_toks: int = 256,
                 show_progress: bool = True, **ignored: Any) -> None:
        super().__init__()
        unknown = sorted(k for k, v in ignored.items() if k != "max_batch_size" and v is not None)
        if unknown:
            raise AOGPTError(f"unknown model argument(s) for aogpt: {', '.join(unknown)}",
                             "use pretrained, weights, order, K, batch_size, device, seed, gen_order, max_gen_toks")
        if (pretrained is None) == (model is None):
            raise AOGPTError("the aogpt harness model needs exactly one of pretrained=PATH and model=",
                             "pass pretrained=RUN_OR_FOLDER (or a loaded model in Python)")
        if model is None:
            model = load(pretrained, weights=weights, device=device or "cpu")
        self.model = unwrap(model)
        if device is not None:
            self.model.to(device)
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if self.tokenizer is None:
            raise AOGPTError("the model has no tokenizer saved with it", "pass tokenizer= (an aogpt tokenizer)")
        self.order, self.K = str(order), int(K)
        self.any_order = reading_mode(self.model, self.order)
        if self.any_order and self.K < 2:
            raise AOGPTError(f"the any-order bound needs K >= 2 orders for its standard error, got K={self.K}",
                             "pass K=8 (or order=l2r for the exact likelihood)")
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        self.seed, self.gen_order, self.max_gen_toks = int(seed), str(gen_order), int(max_gen_toks)
        self.show_progress = show_progress
        self._device = next(self.model.parameters()).device
        self.scores: dict[str, list[Score]] = {"loglikelihood": [], "loglikelihood_rolling": []}

    # ------------------------------------------------------------------ lm-eval's interface
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [split_pair(self.tokenizer.encode, *req.args) for req in requests]
        scores = self._run("loglikelihood", len(pairs), disable_tqdm, lambda step: score_continuations(
            self.model, pairs, order=self.order, num_orders=self.K, seed=self.seed, batch_size=self.batch_size,
            progress=step))
        for req, s in zip(requests, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, (s.logprob, s.is_greedy))
        return [(s.logprob, s.is_greedy) for s in scores]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        docs = [list(self.tokenizer.encode(req.args[0])) for req in requests]
        scores = self._run("loglikelihood_rolling", len(docs), disable_tqdm, lambda step: score_documents(
            self.model, docs, order=self.order, num_orders=self.K, seed=self.seed, batch_size=self.batch_size,
            progress=step))
        for req, s in zip(requests, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, s.logprob)
        return [s.logprob for s in scores]

    def loglikelihood_infill(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """log p(span | prefix, suffix) for requests whose args are (prefix, span, suffix) strings:
        exact, the sides read first and the span left to right (`aogpt.hf.scoring.score_infill`).
        Not one of lm-eval's own request types (it asks for continuations only): for tasks and scripts
        that score a gap given both sides. Each piece is encoded on its own."""
        out = []
        with progress(total=len(requests), desc="harness: loglikelihood_infill",
                      disable=disable_tqdm or not self.show_progress) as bar:
            for req in requests:
                prefix, span, suffix = (list(self.tokenizer.encode(t)) if t else [] for t in req.args)
                out.append(score_infill(self.model, prefix, span, suffix))
                bar.update(1)
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        with progress(total=len(requests), desc="harness: generate_until",
                      disable=disable_tqdm or not self.show_progress) as bar:
            for req in requests:
                context, gen_kwargs = req.args
                text = self.continue_text(context, dict(gen_kwargs or {}))
                self.cache_hook.add_partial("generate_until", req.args, text)
                out.append(text)
                bar.update(1)
        return out

    # ------------------------------------------------------------------ helpers
    def _run(self, kind: str, total: int, disable_tqdm: bool, work: Any) -> list[Score]:
        with progress(total=total, desc=f"harness: {kind}", disable=disable_tqdm or not self.show_progress) as bar:
            scores = work(bar.update)
        self.scores[kind].extend(scores)
        return scores

    def continue_text(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        """The generated continuation of `context`, cut at the first stop string."""
        from aogpt.generation.generate import generate

        unknown = sorted(set(gen_kwargs) - SAMPLING_KEYS)
        if unknown:
            raise AOGPTError(f"generation arguments not supported by aogpt: {', '.join(unknown)}",
                             f"use only {', '.join(sorted(SAMPLING_KEYS))}")
        until = gen_kwargs.get("until") or []
        stops = [until] if isinstance(until, str) else list(until)
        stops.append(EOT_TEXT)
        window = self.model.config.block_size
        wanted = int(gen_kwargs.get("max_gen_toks", gen_kwargs.get("max_new_tokens", self.max_gen_toks)))
        new = max(1, min(wanted, window))
        prompt = list(self.tokenizer.encode(context))[-(window - new):] if window > new else []
        sample = bool(gen_kwargs.get("do_sample", False)) and float(gen_kwargs.get("temperature", 1.0)) > 0
        options: dict[str, Any] = {"greedy": not sample}
        if sample:
            options.update(temperature=float(gen_kwargs.get("temperature", 1.0)),
                           top_k=int(gen_kwargs.get("top_k") or 0), top_p=float(gen_kwargs.get("top_p") or 1.0))
        seed = draw_seed(self.seed, "generate_until", context)  # each request its own random stream
        result = generate(self.model, prompt=prompt or None, length=len(prompt) + new, num_samples=1, seed=seed,
                          order=self.gen_order, policy="count", steps=new, **options)
        text = self.tokenizer.decode(result.tokens[0, len(prompt):])
        cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
        return text[:cut]

    def bound_report(self) -> dict[str, Any] | None:
        """For the any-order bound: how many requests were scored with K orders, and the Monte-Carlo
        standard error of their summed log-likelihood (the draws of different requests are independent)."""
        scored = [s for kind in self.scores.values() for s in kind]
        if not self.any_order or not scored:
            return None
        variance = sum((s.se or 0.0) ** 2 for s in scored)
        return {"order": "random", "K": self.K, "requests": len(scored),
                "logprob_sum": sum(s.logprob for s in scored), "logprob_sum_se": math.sqrt(variance),
                "mean_request_se": sum(s.se or 0.0 for s in scored) / len(scored)}

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.spec

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def device(self) -> torch.device:
        return self._device


__all__ = ["AOGPTLM", "split_pair"]
