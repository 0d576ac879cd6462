"""`Trainer`: one training run, composed of the parts in this package.

It builds the model, its EMA copy, the optimizer, the data and order streams and the wrappers (DDP,
FSDP, torch.compile), holds the run's counters, and hands the work to the parts: the optimizer step
(`step`), validation (`validation`), checkpoints (`checkpointing`), metrics (`metrics`) and the
loop (`loop`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aogpt import compiling
from aogpt.config import ModelConfig, TrainConfig
from aogpt.curriculum import make_curriculum
from aogpt.data.fim import fim_rows, sentinels_of
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.model import Transformer
from aogpt.precision import name_of
from aogpt.seeds import draw_seed
from aogpt.train import checkpointing, distributed, loop, recipe
from aogpt.train.ema import EMA
from aogpt.train.init import init_target_pathway
from aogpt.train.metrics import MetricsLog
from aogpt.train.schedule import LRSchedule
from aogpt.train.sources import BatchSource
from aogpt.train.step import (
    OptimizerStep,
    StepResult,
    accumulation_steps,
    autocast,
    autocast_dtype,
    make_optimizer,
    training_loss,
)
from aogpt.train.throughput import Window, flops_per_token, peak_flops
from aogpt.train.validation import Validation


class Trainer:
    """One training run: model, EMA, optimizer, data/order streams, metrics and checkpoints."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        data: BatchSource,
        out: Path | None,
        *,
        info: distributed.DistInfo | None = None,
        run_meta: dict[str, Any] | None = None,
        tokenizer: Any = None,
        show_progress: bool = True,
    ):
        cfg.validate()  # every number in its range, also when the config was built by hand
        self.info = info or distributed.DistInfo()
        self.device = resolve_device(cfg.device, self.info.local_rank if self.info.enabled else None)
        self.model_cfg, self.cfg = model_cfg, cfg
        self.data, self.out, self.tokenizer = data, Path(out) if out else None, tokenizer
        self.run_meta = run_meta or {}
        self.show_progress = show_progress and self.info.is_main
        self.block_size = model_cfg.block_size
        self.accum = accumulation_steps(cfg, self.info.world_size, self.block_size)
        self.sequences_per_step = cfg.batch_size * self.accum * self.info.world_size
        self.tokens_per_step = self.sequences_per_step * self.block_size
        self.family = family(model_cfg.variant)
        self.orders = make_curriculum(cfg.curriculum, cfg.order, cfg.l2r_first_steps, cfg.decay_steps)
        self.order_sampler = self.orders.final
        self.family.check_order(self.order_sampler)
        if self.orders.stages and not self.family.causal:
            raise AOGPTError(f"variant {model_cfg.variant} draws its own masks, so an order curriculum does nothing",
                             "drop the curriculum (and l2r_first_steps)")
        for _, _, stage in self.orders.stages:
            if isinstance(stage, tuple) and not self.family.any_order:  # a Mallows ramp is never left to right
                raise AOGPTError(f"variant {model_cfg.variant} reads left to right only (a Mallows ramp in the "
                                 "curriculum)", "drop the curriculum")
            if not isinstance(stage, tuple):
                self.family.check_order(stage, " in the curriculum")
        self.fim = sentinels_of(model_cfg) if cfg.fim_rate > 0 else None  # fill in the middle (aogpt.data.fim)
        if cfg.fim_rate > 0 and self.fim is None:
            raise AOGPTError("fim_rate needs a model whose vocabulary holds the fill-in-the-middle sentinels",
                             "train it with aogpt train --fim-rate (which adds them), or set fim_rate 0")
        self.schedule = LRSchedule(cfg)
        self.hold = recipe.Hold(cfg, self.block_size, self.schedule)  # how much replay and distillation weigh
        self.metrics = MetricsLog(self.out, self.info.is_main)
        self._build_model()
        self.optimizer_step = OptimizerStep(self.model, self.step_model, self.optimizer, cfg, self.info,
                                            self.device, self.amp, self.accum, self.schedule, self.teacher,
                                            self.hold)
        self.validation = Validation(data, cfg, self.block_size, self.family, self.info, self.device, self.amp)
        self.peak_flops = peak_flops(self.device)
        self.flops_per_token = flops_per_token(model_cfg, self.block_size)

    def _build_model(self) -> None:
        """Weights, EMA, optimizer, the data/order streams and the wrappers, seeded for reproducibility."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.raw = Transformer(self.model_cfg).to(self.device)
        init_target_pathway(self.raw, cfg)
        if cfg.init_from:
            checkpointing.init_weights_from(self.raw, Path(cfg.init_from))
        recipe.check_recipe(self.raw, cfg)
        self.teacher = recipe.make_teacher(self.raw, cfg)  # the frozen start, for distillation (or None)
        self.replay_from = recipe.replay_from(cfg)
        self.source_eval: dict[str, float] = {}  # validation of the start, when it is a pretrained model
        self.ema = EMA(self.raw, cfg.ema_decay, cfg.ema_warmup)
        self.amp = autocast_dtype(cfg, self.device)
        self.data_gen = torch.Generator().manual_seed(cfg.seed)
        self.order_gen = torch.Generator(self.device).manual_seed(cfg.seed + 1)
        self.fim_gen = torch.Generator().manual_seed(draw_seed(cfg.seed, "fim"))  # its own: the data stream stays
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self.clock = time.perf_counter  # what times the steps (the time limit, the schedule's speed); tests fake it
        self.window = Window()  # the steps since the last train record (saved with checkpoints)
        self.last_eval: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self._stop_signal: str | None = None
        torch.manual_seed(cfg.seed + 7919 * (self.info.rank + 1))  # dropout streams differ per rank

        self.model: nn.Module = distributed.wrap_model(self.raw, self.info, self.device, cfg.fsdp, self.amp)
        if cfg.fsdp:
            distributed.wrap_model(self.ema.model, self.info, self.device, True, self.amp)
        self.optimizer = make_optimizer(self.raw, cfg, self.device)  # after sharding: FSDP replaces the parameters
        self.step_model = self.model
        self.compiled, self.compile_why = compiling.decide_training(
            cfg.compile, self.device, max_minutes=cfg.max_minutes,
            world_size=self.info.world_size, fsdp=cfg.fsdp, precision=name_of(self.amp))
        self.compile_seconds: float | None = None  # measured by `warm_up`
        if self.compiled:
            compiling.use_persistent_cache()
            self.step_model = torch.compile(self.model, dynamic=False)  # fixed shapes: compiled once
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    # ------------------------------------------------------------------ one step
    def _global_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step's sequences and orders (all ranks, all micro-steps) from the shared streams;
        the orders from the curriculum's stage of this step (`aogpt.curriculum.Curriculum`)."""
        idx = self.data.get_batch("train", self.sequences_per_step, self.block_size, self.data_gen)
        if self.fim is not None:
            idx = fim_rows(idx, self.cfg.fim_rate, self.cfg.fim_spm_rate, self.fim, self.fim_gen)
        order = self.orders.sample(self.step, self.sequences_per_step, self.block_size, self.device, self.order_gen)
        if self.cfg.replay_l2r > 0 and self.step >= self.replay_from:
            order = recipe.replay_rows(order, self.cfg.replay_l2r * self.hold(self.step), self.order_gen)
        return idx, order

    def warm_up(self) -> float:
        """Compile the training step before the first timed one: forward and backward of a batch of the
        run's shapes, thrown away (no update; the gradients cleared, every random stream as it was).
        Returns the seconds it took (0.0 when the step is not compiled, or already was)."""
        if not self.compiled or self.compile_seconds is not None:
            return 0.0
        start = self.clock()
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None
        B, T = self.cfg.batch_size, self.block_size
        idx = torch.zeros((B, T), dtype=torch.long, device=self.device)
        order = torch.arange(T, device=self.device).expand(B, T)
        scratch = torch.Generator(self.device).manual_seed(0)  # the encoder draws masks from it
        self.model.train()
        with autocast(self.device, self.amp):
            loss = training_loss(self.step_model, idx, order, scratch)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        self.compile_seconds = self.clock() - start
        return self.compile_seconds

    def train_step(self) -> StepResult:
        """One optimizer step over the global batch (this rank's micro-batches), then the EMA."""
        idx, order = self._global_batch()
        result = self.optimizer_step(self.step, idx, order, self.order_gen, self.last_checkpoint)
        self.ema.update(self.raw)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return result

    # ------------------------------------------------------------------ validation
    def evaluate(self) -> dict[str, float]:
        """Mean validation loss per token: left to right and any-order, raw and EMA weights."""
        self.last_eval = self.validation({"raw": self.model, "ema": self.ema.model})
        return self.last_eval

    # ------------------------------------------------------------------ checkpoints
    def state_for_resume(self) -> dict[str, Any]:
        """What goes into trainer.pt (`checkpointing.trainer_state`)."""
        return checkpointing.trainer_state(self)

    def save(self) -> Path | None:
        """Write `ckpt-<step>` (rank 0 only), atomically, and keep the last `keep_last`."""
        return checkpointing.save(self)

    def resume(self, ckpt: Path) -> None:
        """Restore weights, EMA, optimizer and the data/order/dropout streams from a checkpoint."""
        checkpointing.resume(self, ckpt)

    # ------------------------------------------------------------------ metrics
    @property
    def metrics_path(self) -> Path | None:
        return self.metrics.path

    def log(self, record: dict[str, Any]) -> None:
        self.metrics.log(record)

    def plot(self) -> Path | None:
        return self.metrics.plot(f"{self.model_cfg.variant} ({self.cfg.order})")

    # ------------------------------------------------------------------ the loop
    def fit(self, until: int | None = None) -> dict[str, Any]:
        """Train until max_steps (or step `until`, max_minutes or a signal), then validate and checkpoint."""
        return loop.fit(self, until)
