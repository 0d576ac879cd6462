"""The training loop: AdamW, warmup + cosine, accumulation, clipping, EMA, validation, checkpoints.

Reproducibility. Every optimizer step draws its *global* batch (all ranks, all micro-steps) from one
data generator and one order generator shared by every rank; each rank then takes its rows. So one
process with gradient accumulation and N processes see exactly the same sequences and orders, and
a resumed run continues the same streams (their states are in the checkpoint). On CPU the metrics
of a resumed run equal those of an uninterrupted one.

Validation uses the same held-out windows every time: the left-to-right loss, and the any-order
loss under orders drawn from a generator re-seeded with `eval_orders_seed` (the same orders every
time), for the raw and the EMA weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from aogpt.checkpoint import (
    checkpoint_name,
    find_checkpoint,
    load_state_into,
    prune_checkpoints,
    read_config,
    read_weights,
    save_checkpoint,
    weights_of,
)
from aogpt.config import ModelConfig, TrainConfig, to_dict
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.families import family, family_of
from aogpt.model import Transformer
from aogpt.orders import make_order_sampler
from aogpt.plots import plot_loss_curves
from aogpt.train import distributed
from aogpt.train.ema import EMA


class BatchSource(Protocol):
    """What the trainer reads from: `aogpt.data.PreparedData` or a synthetic stand-in."""

    def get_batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator) -> torch.Tensor: ...

    def iter_eval_batches(self, split: str, batch_size: int, block_size: int, max_batches: int | None = None): ...


class RandomTokens:
    """Uniform random tokens: a data source for benchmarks and tests that need no corpus."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def get_batch(self, split, batch_size, block_size, generator):
        return torch.randint(self.vocab_size, (batch_size, block_size), generator=generator)

    def iter_eval_batches(self, split, batch_size, block_size, max_batches=None):
        g = torch.Generator().manual_seed(0)
        for _ in range(max_batches or 1):
            yield torch.randint(self.vocab_size, (batch_size, block_size), generator=g)


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA (by default), none (fp32) on CPU."""
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    table = {
        "float32": None,
        "fp32": None,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if cfg.dtype not in table:
        raise AOGPTError(f"unknown dtype {cfg.dtype!r}", "use auto, float32 or bfloat16")
    return table[cfg.dtype]


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings (>= 2-D) only, not on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at `max_steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if step >= cfg.max_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def training_loss(model: nn.Module, idx: torch.Tensor, order: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mean per-token loss of the batch, as the model's family defines it: the any-order loss for
    decoders (one causal pass, the orders already drawn), the masked-diffusion loss for the encoder."""
    return family_of(model).train_loss(model, idx, order, generator).mean()


def accumulation_steps(cfg: TrainConfig, world_size: int, block_size: int) -> int:
    """Micro-steps per optimizer step: `grad_accum`, or derived from `global_batch_tokens`."""
    if cfg.global_batch_tokens <= 0:
        return cfg.grad_accum
    per_micro = world_size * cfg.batch_size * block_size
    if cfg.global_batch_tokens % per_micro:
        raise AOGPTError(
            f"global batch of {cfg.global_batch_tokens} tokens is not divisible by world size {world_size} x "
            f"micro-batch {cfg.batch_size} x block {block_size} = {per_micro}",
            "change --global-batch-tokens or --batch-size",
        )
    return cfg.global_batch_tokens // per_micro


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 x weights used in matmuls + attention."""
    d, L = cfg.n_embd, cfg.n_layer
    per_block = 12 * d * d + (6 * d * cfg.target_dim if cfg.target == "adaln" else 0)
    matmul_params = L * per_block + d * cfg.vocab_size
    return 6 * matmul_params + 12 * L * d * seq_len


PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of known GPUs (for MFU in the logs); None when unknown or on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


@dataclass
class StepResult:
    loss: float
    lr: float
    grad_norm: float


class NonFiniteLoss(AOGPTError):
    pass


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
        self.order_sampler = make_order_sampler(cfg.order)
        self.family.check_order(self.order_sampler)

        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.raw = Transformer(model_cfg).to(self.device)
        if cfg.init_from:
            self._init_weights_from(Path(cfg.init_from))
        self.ema = EMA(self.raw, cfg.ema_decay, cfg.ema_warmup)
        self.optimizer = make_optimizer(self.raw, cfg, self.device)
        self.amp = autocast_dtype(cfg, self.device)
        self.data_gen = torch.Generator().manual_seed(cfg.seed)
        self.order_gen = torch.Generator(self.device).manual_seed(cfg.seed + 1)
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self.last_eval: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self._stop_signal: str | None = None
        torch.manual_seed(cfg.seed + 7919 * (self.info.rank + 1))  # dropout streams differ per rank

        self.model: nn.Module = distributed.wrap_model(self.raw, self.info, self.device, cfg.fsdp)
        if cfg.fsdp:
            distributed.wrap_model(self.ema.model, self.info, self.device, True)
        self.step_model = self.model
        if cfg.compile and self.device.type == "cuda":
            self.step_model = torch.compile(self.model)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.peak_flops = peak_flops(self.device)
        self.flops_per_token = flops_per_token(model_cfg, self.block_size)

    # ------------------------------------------------------------------ setup helpers
    def _init_weights_from(self, path: Path) -> None:
        ckpt = find_checkpoint(path)
        load_state_into(self.raw, weights_of(read_weights(ckpt), "raw"), where=str(ckpt))

    # ------------------------------------------------------------------ one step
    def _global_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.data.get_batch("train", self.sequences_per_step, self.block_size, self.data_gen)
        order = self.order_sampler.sample(self.sequences_per_step, self.block_size, self.device, self.order_gen)
        return idx, order

    def train_step(self) -> StepResult:
        """One optimizer step over the global batch (this rank's micro-batches)."""
        self.model.train()
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        idx_all, order_all = self._global_batch()
        B, world, total = self.cfg.batch_size, self.info.world_size, torch.zeros((), device=self.device)
        for micro in range(self.accum):
            start = (micro * world + self.info.rank) * B
            idx = idx_all[start : start + B].to(self.device, non_blocking=True)
            order = order_all[start : start + B]
            sync = micro == self.accum - 1
            with self._no_sync(not sync), self._autocast():
                loss = training_loss(self.step_model, idx, order, self.order_gen) / self.accum
            loss.backward()
            total += loss.detach()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            if self.cfg.grad_clip > 0
            else torch.zeros(())
        )
        loss_value = float(distributed.all_reduce_sum(total, self.info)) / world
        if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
            raise NonFiniteLoss(
                f"the training loss became {loss_value} at step {self.step + 1}",
                f"lower the learning rate; the last good checkpoint is {self.last_checkpoint or 'none'}",
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.ema.update(self.raw)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return StepResult(loss=loss_value, lr=lr, grad_norm=float(grad_norm))

    def _no_sync(self, skip: bool):
        if skip and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2
            self.model.set_requires_gradient_sync(not skip)
        return contextlib.nullcontext()

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp)

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean validation loss per token: left to right and any-order, raw and EMA weights."""
        results: dict[str, float] = {}
        for weights, model in (("raw", self.model), ("ema", self.ema.model)):
            model.eval()
            sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # l2r, any, tokens
            order_gen = torch.Generator(self.device).manual_seed(self.cfg.eval_orders_seed)
            batches = self.data.iter_eval_batches("val", self.cfg.batch_size, self.block_size, self.cfg.eval_batches)
            for i, idx in enumerate(batches):
                order = make_order_sampler("uniform").sample(idx.shape[0], idx.shape[1], self.device, order_gen)
                if i % self.info.world_size != self.info.rank:
                    continue
                idx = idx.to(self.device)
                with self._autocast():
                    l2r, anyo = self.family.validation_losses(model, idx, order)
                    anyo = torch.zeros((), device=self.device) if anyo is None else anyo
                sums += torch.stack(
                    [l2r.double(), anyo.double(), torch.tensor(idx.numel(), device=self.device, dtype=torch.float64)]
                )
            distributed.all_reduce_sum(sums, self.info)
            if sums[2] == 0:
                raise AOGPTError("the validation split gave no batches", "prepare more validation data")
            results[f"val/l2r/{weights}"] = float(sums[0] / sums[2])
            if self.family.any_order:
                results[f"val/any/{weights}"] = float(sums[1] / sums[2])
        self.last_eval = results
        return results

    # ------------------------------------------------------------------ checkpoints
    # Under FSDP the weights and optimizer state are sharded: gather full copies (a collective on
    # every rank) for checkpoints; otherwise plain state dicts, which keep CPU resumes bit-exact.
    def _full_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        if not self.cfg.fsdp:
            return module.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _optimizer_state(self) -> dict[str, Any]:
        if not self.cfg.fsdp:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.raw, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _load_full_state(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))

    def state_for_resume(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_seconds": self.train_seconds,
            "sharding": "fsdp" if self.cfg.fsdp else "replicated",
            "optimizer": self._optimizer_state(),
            "ema_updates": self.ema.num_updates,
            "data_gen": self.data_gen.get_state(),
            "order_gen": self.order_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
        }

    def save(self) -> Path | None:
        """Write `ckpt-<step>` (rank 0 only), atomically, and keep the last `keep_last`."""
        raw, ema = self._full_state(self.raw), self._full_state(self.ema.model)
        trainer_state = self.state_for_resume()
        path = None
        if self.info.is_main and self.out is not None:
            config = {
                "model": to_dict(self.model_cfg),
                "train": to_dict(self.cfg),
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "last_eval": self.last_eval,
                **self.run_meta,
            }
            path = save_checkpoint(self.out / checkpoint_name(self.step), self.raw, config=config, raw=raw,
                                   ema=ema, trainer_state=trainer_state, tokenizer=self.tokenizer)
            prune_checkpoints(self.out, self.cfg.keep_last)
        distributed.barrier(self.info)
        self.last_checkpoint = path or self.last_checkpoint
        return path

    def resume(self, ckpt: Path) -> None:
        """Restore weights, EMA, optimizer and the data/order/dropout streams from a checkpoint."""
        read_config(ckpt)
        tensors = read_weights(ckpt)
        raw, ema = weights_of(tensors, "raw"), {**weights_of(tensors, "raw"), **weights_of(tensors, "ema")}
        state_path = ckpt / "trainer.pt"
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure to read means a damaged file
            raise AOGPTError(f"trainer state {state_path} is missing or corrupted ({type(exc).__name__})",
                             "resume from an earlier checkpoint with --resume-from") from None
        sharding = "fsdp" if self.cfg.fsdp else "replicated"
        if state.get("sharding", "replicated") != sharding:
            raise AOGPTError(f"{ckpt} was written with {state.get('sharding')} optimizer state, this run is {sharding}",
                             "resume with the same --fsdp setting")
        if self.cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            self._load_full_state(self.raw, raw)
            self._load_full_state(self.ema.model, ema)
            set_optimizer_state_dict(self.raw, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            load_state_into(self.raw, raw, where=str(ckpt))
            self.ema.load_state_dict(ema, state["ema_updates"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.ema.num_updates = int(state["ema_updates"])
        self.data_gen.set_state(state["data_gen"])
        self.order_gen.set_state(state["order_gen"].to(self.order_gen.get_state().device))
        torch.set_rng_state(state["torch_rng"])
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.train_seconds = float(state["train_seconds"])
        self.last_checkpoint = ckpt
        self._truncate_metrics(self.step)

    # ------------------------------------------------------------------ metrics
    @property
    def metrics_path(self) -> Path | None:
        return self.out / "metrics.jsonl" if self.out else None

    def log(self, record: dict[str, Any]) -> None:
        if self.info.is_main and self.metrics_path is not None:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _truncate_metrics(self, step: int) -> None:
        """Drop records a crashed run wrote after the checkpoint we resume from."""
        path = self.metrics_path
        if not self.info.is_main or path is None or not path.is_file():
            return
        keep = [
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        from aogpt.io import atomic_write_text

        atomic_write_text(path, "".join(line + "\n" for line in keep))

    def plot(self) -> Path | None:
        if not self.info.is_main or self.out is None:
            return None
        title = f"{self.model_cfg.variant} ({self.cfg.order})"
        return plot_loss_curves(self.metrics_path, self.out / "loss.png", title=title)

    # ------------------------------------------------------------------ the loop
    def _handle_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._stop_signal = signal.Signals(signum).name

    def fit(self) -> dict[str, Any]:
        """Train until max_steps (or max_minutes, or a signal), then validate and checkpoint."""
        from aogpt.cli.common import progress

        cfg = self.cfg
        previous = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = progress(total=cfg.max_steps, desc="train", disable=not self.show_progress, initial=self.step)
        window_tokens, window_start, window_loss, window_steps = 0, time.perf_counter(), 0.0, 0
        last = None
        try:
            while self.step < cfg.max_steps:
                t0 = time.perf_counter()
                last = self.train_step()
                self.train_seconds += time.perf_counter() - t0
                window_tokens += self.tokens_per_step
                window_loss += last.loss
                window_steps += 1
                bar.update(1)
                if self.step % cfg.log_interval == 0 or self.step == cfg.max_steps:
                    elapsed = time.perf_counter() - window_start
                    tps = window_tokens / max(elapsed, 1e-9)
                    record = {
                        "kind": "train",
                        "step": self.step,
                        "loss": window_loss / window_steps,
                        "lr": last.lr,
                        "grad_norm": last.grad_norm,
                        "tokens": self.tokens_seen,
                        "tokens_per_s": tps,
                    }
                    if self.peak_flops:
                        record["mfu"] = tps * self.flops_per_token / (self.peak_flops * self.info.world_size)
                    self.log(record)
                    bar.set_postfix(loss=f"{window_loss / window_steps:.3f}", tok_s=f"{tps:,.0f}")
                    window_tokens, window_start, window_loss, window_steps = 0, time.perf_counter(), 0.0, 0
                out_of_time = cfg.max_minutes > 0 and self.train_seconds >= cfg.max_minutes * 60
                stop = distributed.broadcast_flag(bool(self._stop_signal) or out_of_time, self.info, self.device)
                if stop or self.step == cfg.max_steps:
                    break
                if self.step % cfg.eval_interval == 0:
                    self.log({"kind": "eval", "step": self.step, **self.evaluate()})
                    self.plot()
                    window_start = time.perf_counter()
                if self.step % cfg.ckpt_interval == 0:
                    self.save()
                    window_start = time.perf_counter()
        finally:
            bar.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        final_eval = self.evaluate()
        self.log({"kind": "eval", "step": self.step, **final_eval})
        ckpt = self.save()
        plot = self.plot()
        return {
            "step": self.step,
            "stopped_by": self._stop_signal or ("time" if self.step < cfg.max_steps else "max_steps"),
            "train_loss": last.loss if last else None,
            **final_eval,
            "tokens_seen": self.tokens_seen,
            "tokens_per_s": self.tokens_seen / max(self.train_seconds, 1e-9),
            "train_seconds": self.train_seconds,
            "checkpoint": str(ckpt or self.last_checkpoint or ""),
            "plot": str(plot) if plot else None,
            "run_dir": str(self.out) if self.out else None,
            "params": self.raw.num_params(),
        }
