"""Generation settings as one object, shared by the Python API, the CLI and the benchmarks.

`GenerationSettings` = how each token is drawn (`SamplingConfig`: temperature, top-p, top-k,
greedy, precision) + how the positions are revealed (`DecodePlan`: steps, policy, schedule, order)
+ how the work is run (batch size, KV cache, the decode path's kernels, attention kernel,
torch.compile, CUDA graphs).
`aogpt.generation.generate.generate(model, settings=...)` takes it; the familiar keyword arguments
(``temperature=0.8, steps=32, ...``) are shortcuts that override single fields
(`GenerationSettings.with_overrides`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aogpt.decode.graphs import MODES as GRAPH_MODES
from aogpt.errors import AOGPTError, check_choice
from aogpt.kv_cache import ATTENTION
from aogpt.orders import ADAPTIVE, is_adaptive
from aogpt.sampling import SamplingConfig
from aogpt.schedules import POLICIES, SCHEDULES
from aogpt.validation import bounded, check_ranges

MAX_DRAFT = 1024  # a longer draft is never accepted in full and only costs rows
DECODE_PATHS = ("fast", "reference")  # how a decode step is computed (docs/generation.md, "Decode paths")


@dataclass(frozen=True)
class DecodePlan:
    """Which positions each step reveals.

    speculative: instead of steps, draft K positions per forward and verify them exactly
    (`aogpt.generation.speculative`; "auto" adapts K per sequence). steps: T (None: one step per
    position to generate). policy: "bernoulli" (Lemma 4.1) or "count"
    (None: the model family's default: Bernoulli where several tokens per step are possible).
    schedule: "linear" or "cosine" time grid. order: the unmasking order: an `aogpt.orders` spec
    ("random"/"uniform", "l2r", "blockwise:4", ...), explicit permutation(s) (n,) / (N, n), or an
    adaptive order chosen while decoding ("confidence", "margin", "entropy": `aogpt.generation.adaptive`,
    with the ``count`` policy by default); None: uniform (left to right for a left-to-right model).
    Adaptive orders only: candidates, how many remaining positions are scored per step (None: all;
    C: a random subset of C); threshold, a probability in (0, 1]: also reveal every candidate whose
    largest probability reaches it, and at least one position per step.
    """

    steps: int | None = bounded(None, ge=1, le=2**20, integer=True)
    policy: str | None = None
    schedule: str = "linear"
    order: Any = None
    speculative: int | str | None = None  # exact self-speculative decoding: draft K per forward, or "auto"
    candidates: int | None = bounded(None, ge=1, le=2**20, integer=True)
    threshold: float | None = bounded(None, gt=0.0, le=1.0)

    def validate(self) -> DecodePlan:
        check_ranges(self, "decoding plan")
        if self.policy is not None:
            check_choice("policy", self.policy, POLICIES)
        check_choice("schedule", self.schedule, SCHEDULES)
        spec = self.speculative
        if spec is not None and spec != "auto" and (isinstance(spec, bool) or not isinstance(spec, int)
                                                    or not 1 <= spec <= MAX_DRAFT):
            raise AOGPTError(f"speculative must be a draft length K in 1..{MAX_DRAFT} or 'auto', got {spec!r}",
                             "use e.g. --speculative 4 or --speculative auto")
        if spec is not None and (self.steps is not None or self.policy is not None):
            raise AOGPTError("speculative decoding reveals the positions one at a time along the order (exactly), "
                             "so steps and policy do not apply", "drop --steps/--policy, or drop --speculative")
        if (self.candidates is not None or self.threshold is not None) and not is_adaptive(self.order):
            raise AOGPTError("candidates and threshold apply only to an adaptive order",
                             f"use order {' / '.join(ADAPTIVE)}, or drop them")
        if spec is not None and is_adaptive(self.order):
            raise AOGPTError("speculative decoding follows an order fixed in advance, while an adaptive order is "
                             "chosen while decoding", "drop --speculative, or use a fixed order (random, l2r, ...)")
        return self

    def to_dict(self) -> dict[str, Any]:
        order = self.order if self.order is None or isinstance(self.order, str) else "given"
        out = {"steps": self.steps, "policy": self.policy, "schedule": self.schedule, "order": order,
               "speculative": self.speculative}
        if is_adaptive(self.order):
            out.update(candidates=self.candidates, threshold=self.threshold)
        return out


@dataclass(frozen=True)
class GenerationSettings:
    """Everything that decides what `generate` does, apart from the conditioning and the seed."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    plan: DecodePlan = field(default_factory=DecodePlan)
    batch_size: int = bounded(32, ge=1, le=2**20)
    use_cache: bool = True
    prepack: bool = True  # the decode path's prepared kernels (`aogpt.inference`); False: the model as it is
    attention: str = "auto"  # decode attention kernel (`aogpt.attention`): auto (explicit for bf16 on a CPU), sdpa, ...
    compile: bool | str = False  # torch.compile the decode step (True: inductor; or a backend name)
    skip_noop: bool = True  # encoder: skip the forward of steps that reveal nothing (MDLM's trick)
    decode_path: str = "fast"  # "fast": the measured kernels (`aogpt.decode`); "reference": torch's own
    graphs: str = "auto"  # decode steps as CUDA graphs (`aogpt.decode.graphs`): auto (on a GPU), off, eager

    SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "greedy", "dtype")
    PLAN_FIELDS = ("steps", "policy", "schedule", "order", "speculative", "candidates", "threshold")
    RUN_FIELDS = ("batch_size", "use_cache", "prepack", "attention", "compile", "skip_noop", "decode_path", "graphs")

    def with_overrides(self, **overrides: Any) -> GenerationSettings:
        """A copy with single fields replaced by their keyword names (``temperature=0.8,
        steps=32, batch_size=8``); an unknown name is a TypeError, as for any Python call."""
        sampling = {k: overrides.pop(k) for k in self.SAMPLING_FIELDS if k in overrides}
        plan = {k: overrides.pop(k) for k in self.PLAN_FIELDS if k in overrides}
        run = {k: overrides.pop(k) for k in self.RUN_FIELDS if k in overrides}
        if overrides:
            raise TypeError(f"unknown generation setting(s): {', '.join(sorted(overrides))}")
        return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, **sampling),
                                   plan=dataclasses.replace(self.plan, **plan), **run)

    def validate(self) -> GenerationSettings:
        self.sampling.validate()
        self.plan.validate()
        check_choice("attention", self.attention, ATTENTION)
        check_choice("decode path", self.decode_path, DECODE_PATHS)
        check_choice("graphs", self.graphs, GRAPH_MODES)
        check_ranges(self, "generation settings")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), **self.sampling.to_dict(), "batch_size": self.batch_size,
                "use_cache": self.use_cache, "prepack": self.prepack, "attention": self.attention,
                "compile": self.compile, "decode_path": self.decode_path, "graphs": self.graphs}

    def path(self) -> str:
        """The decode path a generation runs on: `decode_path`, except that FlexAttention (fast only
        compiled) and a compiled step take the reference path (oneDNN's pre-packed weights are opaque
        to inductor: a compiled step runs the model's own linear layers)."""
        return "reference" if self.compile or self.attention == "flex" else self.decode_path


def settings_from(settings: GenerationSettings | None, **overrides: Any) -> GenerationSettings:
    """`settings` (default: `GenerationSettings()`) with keyword overrides applied."""
    base = settings if settings is not None else GenerationSettings()
    if not isinstance(base, GenerationSettings):
        raise AOGPTError(f"settings must be a GenerationSettings, got {type(base).__name__}",
                         "build one with aogpt.generation.settings.GenerationSettings(...)")
    return base.with_overrides(**overrides)


__all__ = ["DecodePlan", "GenerationSettings", "SamplingConfig", "settings_from"]
