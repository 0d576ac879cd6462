"""Model and training configuration: one dataclass each, named presets, overrides with checking.

A run is described by a `ModelConfig` (architecture: the variant and its knobs) and a
`TrainConfig` (optimisation, orders, evaluation, checkpoints). Presets give both; a JSON/TOML file
and command-line flags override single fields. Unknown keys and wrong types are user errors.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.compiling import CHOICES as COMPILE_CHOICES
from aogpt.curriculum import make_curriculum
from aogpt.errors import AOGPTError, check_choice
from aogpt.families import family
from aogpt.orders import Mallows, make_order_sampler
from aogpt.pathway import PATHWAYS
from aogpt.precision import AUTOCAST, canonical
from aogpt.validation import SEED_MAX, bounded, check_ranges

# How the target position (the original position of the token a slot must predict) enters the model
# (paper Fig. 6): none (left-to-right GPT), input (sigma-GPT as reproduced in the paper), input-concat
# (sigma-GPT's own [pos(current) || pos(next)] halves), every-block (the input table re-added before
# every block), per-block (a separate table per block), adaln (AO-GPT: adaptive norm in every block).
TARGET_INJECTIONS = ("none", "input", "input-concat", "every-block", "per-block", "adaln")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")
MLPS = ("gelu", "gelu-tanh", "swiglu")


@dataclass
class ModelConfig:
    """The architecture. Every number states its range (`aogpt.validation.bounded`); `validate`
    checks them and the combinations (a variant's injection, divisibility)."""

    variant: str = "aogpt"
    n_layer: int = bounded(4, ge=1, le=1024)
    n_head: int = bounded(4, ge=1, le=1024)
    n_embd: int = bounded(256, ge=1, le=2**17)
    block_size: int = bounded(256, ge=1, le=2**20)
    vocab_size: int = bounded(8192, ge=1, le=2**31)
    dropout: float = bounded(0.0, ge=0, lt=1)
    bias: bool = True  # biases in linear layers (and LayerNorm when norm == "layernorm")
    norm: str = "rmsnorm"
    norm_eps: float = bounded(1e-5, gt=0, le=1)
    qk_norm: bool = True
    target: str = "adaln"
    target_dim: int = bounded(128, ge=1, le=2**17)  # width of AO-GPT's target-position table that drives adaLN
    tie_head: bool = False
    head_bias: bool = True
    pos_init: str = "normal"  # initial position tables: "normal" (GPT-2) or "sinusoidal" (scaled to std 0.02)
    # The backbone's switches beyond AO-GPT's own blocks (`aogpt.backbone`): what pretrained decoders use
    # (GPT-2: layernorm, gelu-tanh; Llama family: rotary positions, swiglu, grouped-query attention, no biases).
    positions: str = "learned"  # learned tables (wpe), or rotary: queries and keys rotated by each slot's position
    rope_theta: float = bounded(10000.0, gt=0, le=1e12)  # rotary base
    mlp: str = "gelu"  # gelu (exact), gelu-tanh, or swiglu
    mlp_hidden: int = bounded(0, ge=0, le=2**20)  # the MLP's inner width; 0: 4 * n_embd
    n_kv_head: int = bounded(0, ge=0, le=1024)  # key/value heads (grouped-query attention); 0: n_head
    qkv_bias: bool | None = None  # biases of the q/k/v projection; None: as `bias`
    mlp_bias: bool | None = None  # biases of the MLP; None: as `bias`
    # A left-to-right model trained to fill in the middle (`aogpt.data.fim`, train.fim_rate): its sentinel ids
    # [end, prefix, suffix, middle], right after the tokenizer's own; None for every other model.
    fim_tokens: list[int] | None = None
    # How an adapted model reads orders other than left to right (`aogpt.pathway`, docs/adapt.md): "shared", every
    # slot through the same weights; "gated", the source's weights frozen and alone on the slots that read left to
    # right, a new pathway (a delta per linear layer of rank `pathway_rank`, 0: full rank; adaLN; the target table)
    # added on every other slot.
    pathway: str = "shared"
    pathway_rank: int = bounded(0, ge=0, le=2**17)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `n_kv_head`, or one per query head."""
        return self.n_kv_head or self.n_head

    @property
    def causal(self) -> bool:
        """Decoder slots with causal attention (False for a bidirectional encoder family)."""
        return family(self.variant).causal

    def validate(self) -> ModelConfig:
        family(self.variant)  # a known variant (aogpt.families)
        check_ranges(self, "model config", "fix it in --set model.KEY=VALUE or the config file")
        check_choice("target", self.target, TARGET_INJECTIONS)
        check_choice("norm", self.norm, NORMS)
        check_choice("pos_init", self.pos_init, ("normal", "sinusoidal"))
        check_choice("positions", self.positions, POSITIONS)
        check_choice("mlp", self.mlp, MLPS)
        if self.n_head % self.kv_heads:
            raise AOGPTError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}", "change one")
        if self.positions == "rotary" and (self.head_dim % 2 or self.target == "input-concat"):
            raise AOGPTError("rotary positions need an even head size and a target injection other than "
                             "input-concat", "use positions learned")
        if self.n_embd % self.n_head:
            raise AOGPTError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}", "change one")
        reads_target = family(self.variant).target_position
        if not reads_target and self.target != "none":
            raise AOGPTError(f"variant {self.variant} takes no target position (target={self.target})",
                             "set target to none")
        if reads_target and self.target == "none":
            raise AOGPTError(f"variant {self.variant} needs a target-position injection", "set target")
        if self.target == "input-concat" and self.n_embd % 2:
            raise AOGPTError("target input-concat needs an even n_embd", "change n_embd")
        if self.tie_head and self.head_bias:
            raise AOGPTError("a tied output head has no bias in this model", "set head_bias false")
        if self.fim_tokens is not None:
            self._check_fim()
        check_choice("pathway", self.pathway, PATHWAYS)
        if self.pathway == "gated" and (not family(self.variant).any_order or self.target not in ("adaln", "input")):
            raise AOGPTError(f"a gated pathway adds orders other than left to right through adaLN or an input target "
                             f"table, which variant {self.variant} (target {self.target}) has not",
                             "use variant aogpt or sigma (aogpt adapt --variant)")
        return self

    def _check_fim(self) -> None:
        fam = family(self.variant)
        if fam.any_order or not fam.causal:
            raise AOGPTError(f"variant {self.variant} reads in other orders than left to right, so fill-in-the-middle "
                             "rows mean nothing to it", "train fill in the middle with variant gpt")
        ids = self.fim_tokens or []
        if len(ids) != 4 or len(set(ids)) != 4 or not all(isinstance(i, int) and 0 <= i < self.vocab_size
                                                           for i in ids):
            raise AOGPTError(f"fim_tokens must be 4 distinct ids below the vocabulary size {self.vocab_size}, "
                             f"got {ids}", "leave model.fim_tokens to aogpt train --fim-rate")


STEPS_MAX = 10**9  # steps, intervals and warmups: more would run for years


@dataclass
class TrainConfig:
    """Optimisation, orders, evaluation and checkpoints. Every number states its range
    (`aogpt.validation.bounded`); `validate` checks them and the combinations."""

    LEGACY_VALUES: typing.ClassVar[dict[str, dict[Any, Any]]] = {"compile": {True: "on", False: "off"}}

    batch_size: int = bounded(16, ge=1, le=2**24)  # sequences per micro-batch (per process)
    grad_accum: int = bounded(1, ge=1, le=2**20)
    global_batch_tokens: int = bounded(0, ge=0, le=2**48)  # if > 0: grad_accum is derived from it
    max_steps: int = bounded(1000, ge=1, le=STEPS_MAX)
    max_minutes: float = bounded(0.0, ge=0, le=1e8)  # if > 0: stop after this much training time
    lr: float = bounded(1e-3, gt=0, le=1)
    min_lr: float = bounded(1e-4, ge=0, le=1)  # at most lr
    warmup_steps: int = bounded(50, ge=0, le=STEPS_MAX)
    # where the cosine decay reaches min_lr (0: at max_steps); `--extend-to` keeps the original
    # horizon here, so steps past it run at min_lr
    schedule_steps: int = bounded(0, ge=0, le=STEPS_MAX)
    weight_decay: float = bounded(0.05, ge=0, le=1)
    beta1: float = bounded(0.9, ge=0, lt=1)
    beta2: float = bounded(0.95, ge=0, lt=1)
    grad_clip: float = bounded(1.0, ge=0, le=1e6)  # 0: no clipping
    ema_decay: float = bounded(0.999, ge=0, lt=1)
    ema_warmup: bool = True  # decay min(ema_decay, (1+u)/(10+u)) after u updates, as the reference
    order: str = "mixture"  # see aogpt.orders
    # The first N optimizer steps read every sequence left to right, then `order`: a short run otherwise spends
    # its first hundreds of steps at the unigram loss before it learns to use the target position (docs/training.md).
    l2r_first_steps: int = bounded(0, ge=0, le=STEPS_MAX)
    # Order distributions before `order` (aogpt.curriculum.Curriculum), e.g. "l2r@100,mallows:4..0.05@600": from
    # left to right towards the run's order, so the target pathway is learned step by step (docs/training.md).
    curriculum: str = ""
    lr_schedule: str = "cosine"  # cosine, or wsd: warm-up, constant, decay over the last decay_share (train.schedule)
    decay_share: float = bounded(0.2, gt=0, lt=1)  # wsd: the share of the run (or of max_minutes) spent decaying
    # The target pathway (the tables and adaLN layers that carry the target position): its learning rate x this,
    # and its initialisation (aogpt.train.init; none changes the model's forward, only where training starts).
    target_lr_mult: float = bounded(1.0, gt=0, le=1000)
    init_target_std: float = bounded(0.0, ge=0, le=100)  # > 0: target-position tables drawn with this std
    init_modulation_std: float = bounded(0.0, ge=0, le=10)  # > 0: adaLN weights drawn with this std (not zero)
    init_open_gates: bool = False  # adaLN gates start at 1 (every block works from step 0), not at 0
    # The first N steps train the target pathway only, the rest of the model (an adapted backbone) held fixed.
    freeze_backbone_steps: int = bounded(0, ge=0, le=STEPS_MAX)
    # Fine-tuning an adapted model (aogpt.train.recipe, docs/adapt.md): the backbone's rate is lr x this (a
    # pretrained backbone learns slowly, the new target pathway at lr x target_lr_mult); a share of every step's
    # sequences read left to right on top of the stage's orders (replay, after the curriculum's left-to-right
    # stages); and a distillation weight: the KL divergence of the frozen start (the source, read left to right)
    # to the model on the left-to-right sequences, added to the loss.
    backbone_lr_mult: float = bounded(1.0, gt=0, le=1000)
    replay_l2r: float = bounded(0.0, ge=0, le=1)
    distill_l2r: float = bounded(0.0, ge=0, le=1000)
    # How replay and distillation let go (aogpt.train.recipe.Hold): both are weighted by
    # floor + (1 - floor) x how close the step's orders are to left to right, measured against the run's own
    # orders: full weight in the curriculum's left-to-right opening, the floor once the orders are the run's.
    # 1: a constant weight (no letting go).
    hold_floor: float = bounded(1.0, ge=0, le=1)
    # > hold_floor: the weight climbs back to this over the learning rate's decay (wsd: the run's last
    # decay_share), so the model ends held to its source again once it has learned the other orders.
    hold_anneal: float = bounded(0.0, ge=0, le=1)
    eval_interval: int = bounded(100, ge=1, le=STEPS_MAX)
    eval_batches: int = bounded(8, ge=1, le=10**6)
    eval_orders_seed: int = bounded(1234, ge=0, le=SEED_MAX)
    log_interval: int = bounded(10, ge=1, le=STEPS_MAX)
    ckpt_interval: int = bounded(500, ge=1, le=STEPS_MAX)
    keep_last: int = bounded(2, ge=0, le=10**6)  # 0: keep every checkpoint
    seed: int = bounded(1337, ge=0, le=SEED_MAX)
    # Fill in the middle (`aogpt.data.fim`, a left-to-right model only): the share of training rows rearranged as
    # prefix / suffix / middle with sentinel tokens (0: none), and the share of those in SPM rather than PSM order.
    fim_rate: float = bounded(0.0, ge=0, le=1)
    fim_spm_rate: float = bounded(0.5, ge=0, le=1)
    device: str = "auto"
    dtype: str = "auto"  # auto: bf16 autocast on hardware with bf16 units, else fp32 (precision.auto_precision)
    compile: str = "auto"  # auto, on or off: torch.compile the training step (aogpt.compiling decides auto)
    fsdp: bool = False
    init_from: str = ""  # a checkpoint directory to start from (weights only)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes saved with the run

    @property
    def decay_steps(self) -> int:
        """The step where the cosine decay reaches `min_lr`."""
        return self.schedule_steps or self.max_steps

    def validate(self) -> TrainConfig:
        check_ranges(self, "train config", "fix the flag, --set train.KEY=VALUE or the config file")
        if self.min_lr > self.lr:
            raise AOGPTError(f"train config: min_lr {self.min_lr:g} is above lr {self.lr:g}",
                             "use a min_lr at most the learning rate")
        self.dtype = canonical(self.dtype, AUTOCAST)  # any spelling of aogpt.precision's, kept in its short form
        if not DEVICE.fullmatch(self.device):
            raise AOGPTError(f"unknown device {self.device!r}", "use auto, cpu, cuda or cuda:N")
        # unknown or malformed specs are refused (stage ends given as shares are of the run's horizon)
        make_curriculum(self.curriculum, self.order, self.l2r_first_steps, self.decay_steps)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice("compile", self.compile, COMPILE_CHOICES)  # aogpt.compiling decides what auto means
        return self


LR_SCHEDULES = ("cosine", "wsd")  # aogpt.train.schedule
DEVICE = re.compile(r"auto|cpu|cuda(:\d{1,3})?|mps")


# Fine-tuning an adapted model so it keeps its source's left-to-right quality (aogpt.train.recipe; measured in
# docs/adapt.md): the backbone at a tenth of the rate with no re-warm-up to a pre-training peak, the new target
# pathway at ten times it, a quarter of the sequences replayed left to right and distilled towards the source, and
# the orders from left to right through a short Mallows ramp to AO-GPT's mixture. Stages are in steps:
# `--max-minutes` runs as many steps as fit and the stages begin where they would in any run.
ADAPT_RECIPE: dict[str, Any] = dict(
    batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=10,
    backbone_lr_mult=0.1, target_lr_mult=10.0, replay_l2r=0.25, distill_l2r=1.0, order="mixture",
    curriculum="l2r@10,mallows:4..0.05@60", lr_schedule="wsd", decay_share=0.2, eval_interval=250,
    eval_batches=8, log_interval=10, ckpt_interval=1000, ema_decay=0.99)
# Fine-tuning a gated pathway (`aogpt.pathway`, docs/adapt.md): only the new pathway trains (the source is frozen
# and read left to right it stays the source whatever the pathway learns), so there is nothing to hold: no replay,
# no distillation, no left-to-right rows (a left-to-right row's slots are the source's: they teach the pathway
# nothing). The deltas at lr (the backbone's role), adaLN and the target table at 10x it; orders: a Mallows ramp
# from nearly left to right over the first 150 steps (without it the pathway sat on the unigram plateau for 500
# steps), then random and infilling orders (a prefix, the text after a gap, then the gap) in equal shares (the
# screening in docs/adapt.md).
GATED_RECIPE: dict[str, Any] = dict(
    batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=10,
    backbone_lr_mult=1.0, target_lr_mult=10.0, replay_l2r=0.0, distill_l2r=0.0, order="uniform*0.5+infill*0.5",
    curriculum="mallows:4..0.05@150", lr_schedule="wsd", decay_share=0.2, eval_interval=250, eval_batches=8,
    log_interval=10, ckpt_interval=1000, ema_decay=0.99)
GATED_WHY = ("the recipe measured for a gated pathway in docs/adapt.md: only the new pathway trains, read left to "
             "right the model stays its source")
ADAPT_WHY = ("the recipe measured for adapted checkpoints in docs/adapt.md: it keeps the source's left-to-right "
             "quality, at the price of the other orders: in the runs measured, a random order stayed on the unigram "
             "plateau")

# Named presets: model sizes and the training recipe that goes with them.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "model": dict(n_layer=2, n_head=2, n_embd=32, block_size=32, target_dim=16),
        "train": dict(batch_size=8, max_steps=50, lr=3e-3, min_lr=3e-4, warmup_steps=5, eval_interval=25,
                      eval_batches=2, log_interval=5, ckpt_interval=25, ema_decay=0.99),
    },
    "quickstart": {  # scripts/quickstart.sh on bpe:512 (docs/training.md): as many steps as 10 minutes of this
        # machine hold (the decay fitted to the budget), an order curriculum from left to right to a mixture with
        # 30% left to right (the paper's 10% leaves left to right at 2.5 bits per byte in this budget)
        "model": dict(n_layer=4, n_head=3, n_embd=192, block_size=128, target_dim=128),
        "train": dict(batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=20,
                      order="mixture:0.3", curriculum="l2r@100,mallows:4..0.05@600", lr_schedule="wsd", decay_share=0.2,
                      eval_interval=250, eval_batches=8, log_interval=10, ckpt_interval=1000, ema_decay=0.99),
    },
    "auto": {  # the quickstart's recipe with the model sized at the start to the compute the time budget holds on
        # this machine (aogpt.train.sizing: width, heads and the curriculum's stages chosen before the first step)
        "model": dict(n_layer=4, n_head=3, n_embd=192, block_size=128, target_dim=128),
        "train": dict(batch_size=16, max_steps=100_000, max_minutes=10.0, lr=3e-3, min_lr=3e-4, warmup_steps=20,
                      order="mixture:0.3", curriculum="l2r@100,mallows:4..0.05@600", lr_schedule="wsd", decay_share=0.2,
                      eval_interval=250, eval_batches=8, log_interval=10, ckpt_interval=1000, ema_decay=0.99),
    },
    "adapt": {  # fine-tuning an adapted checkpoint (`aogpt adapt` writes it as the checkpoint's recipe): the
        # recipe measured in docs/adapt.md. The model is the checkpoint's; these are the train fields only.
        "model": {},
        "train": dict(ADAPT_RECIPE),
    },
    "adapt-gated": {  # fine-tuning a gated pathway (`aogpt adapt --pathway gated` writes it as the recipe)
        "model": {},
        "train": dict(GATED_RECIPE),
    },
    "cpu-small": {  # a small CPU model: about 7 minutes (850 steps, 1.7 M tokens) on 2 CPU cores
        "model": dict(n_layer=4, n_head=3, n_embd=192, block_size=128, target_dim=128),
        "train": dict(batch_size=16, max_steps=850, lr=2e-3, min_lr=2e-4, warmup_steps=50, eval_interval=200,
                      eval_batches=8, log_interval=10, ckpt_interval=400, ema_decay=0.998),
    },
    "gpt2-small": {
        "model": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, target_dim=128),
        "train": dict(batch_size=32, global_batch_tokens=524288, max_steps=600000, lr=6e-4, min_lr=6e-5,
                      warmup_steps=2000, weight_decay=0.05, ema_decay=0.9999, eval_interval=2000,
                      eval_batches=50, ckpt_interval=2000, log_interval=10),
    },
    "gpt2-medium": {
        "model": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50304, target_dim=128),
        "train": dict(batch_size=16, global_batch_tokens=524288, max_steps=600000, lr=3e-4, min_lr=3e-5,
                      warmup_steps=2000, weight_decay=0.05, ema_decay=0.9999, eval_interval=2000,
                      eval_batches=50, ckpt_interval=2000, log_interval=10),
    },
}



ANY_ORDER_RAMP = (4.0, 0.05)  # the Mallows dispersions an any-order start ramps through (nearly l2r -> nearly uniform)


def any_order_start(order: str, steps: int, target: str = "adaln") -> dict[str, Any]:
    """The `TrainConfig` fields that take an any-order decoder off the unigram plateau in a run of `steps`
    steps (docs/training.md, "Leaving the unigram plateau"): its orders go from left to right (the first
    1/18 of the run) through a Mallows ramp (until a third of it) to `order`, and its target pathway learns
    at 10x the rate, with adaLN's gates open from the first step (`target` adaln). Nothing for orders that
    need no target position: left to right, or one fixed order, where a slot's target follows from where
    it is."""
    sampler = make_order_sampler(order)
    if sampler.left_to_right or sampler.is_fixed:
        return {}
    first, last = ANY_ORDER_RAMP
    if isinstance(sampler, Mallows):  # ramp to the run's own dispersion (none if it is nearly l2r already)
        last = sampler.theta
    l2r_end = max(1, steps // 18)
    stages = [f"l2r@{l2r_end}"]
    if last < first:
        stages.append(f"mallows:{first:g}..{last:g}@{max(l2r_end + 1, steps // 3)}")
    fields: dict[str, Any] = {"curriculum": ",".join(stages), "l2r_first_steps": 0, "target_lr_mult": 10.0}
    if target == "adaln":
        fields["init_open_gates"] = True
    return fields


def model_config(variant: str = "aogpt", preset: str | None = None, **overrides: Any) -> ModelConfig:
    """The model config for a variant at a preset size, with field overrides applied last."""
    fields: dict[str, Any] = {}
    if preset is not None:
        fields.update(get_preset(preset)["model"])
    fields.update(family(variant).architecture)
    fields.update(overrides)
    return apply_overrides(ModelConfig(variant=variant), fields, where="model config").validate()


# A preset's fields that only an any-order decoder can use (its orders and how they start): a left-to-right
# GPT or an encoder trained with the same preset keeps its own order and no curriculum.
ANY_ORDER_PRESET_FIELDS = ("order", "curriculum")


def train_config(preset: str | None = None, variant: str = "aogpt", **overrides: Any) -> TrainConfig:
    fam = family(variant)
    fields: dict[str, Any] = {"order": fam.default_order}
    if preset is not None:
        usable = fam.any_order and fam.causal
        fields.update({k: v for k, v in get_preset(preset)["train"].items()
                       if usable or k not in ANY_ORDER_PRESET_FIELDS})
    fields.update(overrides)
    return apply_overrides(TrainConfig(), fields, where="train config").validate()


def get_preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise AOGPTError(f"unknown preset {name!r}", f"choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def apply_overrides(obj: Any, values: dict[str, Any], where: str) -> Any:
    """Return a copy of dataclass `obj` with `values` set, checking names and types."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    legacy = getattr(type(obj), "LEGACY_VALUES", {})
    checked = {}
    for key, value in values.items():
        if key in legacy and isinstance(value, bool) and value in legacy[key]:
            value = legacy[key][value]  # a value an older version wrote, in today's spelling
        if key not in names:
            raise AOGPTError(f"unknown key {key!r} in {where}", f"valid keys: {', '.join(sorted(names))}")
        checked[key] = _coerce(key, value, hints[key], where)
    return dataclasses.replace(obj, **checked)


def _coerce(key: str, value: Any, hint: Any, where: str) -> Any:
    hint_in = hint
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # only `X | None` style hints occur here
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
        origin = typing.get_origin(hint)
    target = origin or hint
    if value is None and type(None) in typing.get_args(hint_in):
        return None
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is bool and not isinstance(value, bool) or target is not bool and isinstance(value, bool):
        raise AOGPTError(f"{where}: {key} must be {getattr(target, '__name__', target)}, got {value!r}",
                         "fix its type")
    if not isinstance(value, target):
        raise AOGPTError(f"{where}: {key} must be {getattr(target, '__name__', target)}, got {value!r}",
                         "fix its type")
    return value


def parse_cli_value(text: str) -> Any:
    """A `--set key=value` value: JSON if it parses (numbers, true/false, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def load_config_file(path: Path) -> dict[str, dict[str, Any]]:
    """Read overrides from a JSON or TOML file with optional `model` and `train` sections.

    Keys outside those sections are an error, so a misspelt section is not silently ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise AOGPTError(f"config file {path} not found", "check the path")
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise AOGPTError(f"config file {path} does not parse: {exc}", "fix its syntax") from None
    if not isinstance(data, dict):
        raise AOGPTError(f"config file {path} must hold a table/object", "wrap keys in {...}")
    unknown = set(data) - {"model", "train", "preset", "variant"}
    if unknown:
        raise AOGPTError(f"config file {path}: unknown section(s) {sorted(unknown)}",
                         "use sections model and train (and keys preset, variant)")
    for section in ("model", "train"):
        if not isinstance(data.get(section, {}), dict):
            raise AOGPTError(f"config file {path}: {section} must be a table", "fix the file")
    return data


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def model_config_from_dict(data: dict[str, Any]) -> ModelConfig:
    return apply_overrides(ModelConfig(), data, where="model config").validate()
