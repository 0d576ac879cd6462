"""Checkpoints of a training run: what they hold, writing them, and resuming from them.

A checkpoint (`aogpt.checkpoint`) holds the raw and EMA weights, the run's config, the tokenizer,
and `trainer.pt`: the step and token counters, the optimizer state, the EMA update count, the
states of the data, order and dropout generators, the loss window not yet logged and the last
validation, so a resumed run continues the same streams and writes the same metrics.

Under FSDP the weights and optimizer state are sharded: full copies are gathered (a collective on
every rank) for checkpoints; otherwise plain state dicts, which keep CPU resumes bit-exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from aogpt.config import to_dict
from aogpt.errors import AOGPTError
from aogpt.train import distributed

Trainer = Any  # aogpt.train.trainer.Trainer (not imported: trainer.py imports this module)


def sharding(fsdp: bool) -> str:
    """How the optimizer state is laid out, as recorded in trainer.pt."""
    return "fsdp" if fsdp else "replicated"


def full_state(module: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The module's full state dict (gathered to the CPU under FSDP)."""
    if not fsdp:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> dict[str, Any]:
    """The optimizer's full state dict (gathered to the CPU under FSDP)."""
    if not fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict into an FSDP-sharded module."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))


def init_weights_from(model: nn.Module, path: Path) -> None:
    """Start from the raw weights of the checkpoint at (or newest in) `path`."""
    ckpt = find_checkpoint(path)
    load_state_into(model, weights_of(read_weights(ckpt), "raw"), where=str(ckpt))


def trainer_state(t: Trainer) -> dict[str, Any]:
    """What goes into trainer.pt: everything besides the weights that a resume needs."""
    return {
        "step": t.step,
        "tokens_seen": t.tokens_seen,
        "train_seconds": t.train_seconds,
        "sharding": sharding(t.cfg.fsdp),
        "optimizer": optimizer_state(t.raw, t.optimizer, t.cfg.fsdp),
        "ema_updates": t.ema.num_updates,
        "data_gen": t.data_gen.get_state(),
        "order_gen": t.order_gen.get_state(),
        "fim_gen": t.fim_gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "loss_window": t.window.state_dict(),
        "last_eval": dict(t.last_eval),
        "lr_schedule": t.schedule.state_dict(),
    }


TRAINER_STATE_KEYS = {"step": int, "tokens_seen": int, "train_seconds": float, "optimizer": dict,
                      "ema_updates": int, "data_gen": torch.Tensor, "order_gen": torch.Tensor,
                      "torch_rng": torch.Tensor}


def save(t: Trainer) -> Path | None:
    """Write `ckpt-<step>` (rank 0 only), atomically, and keep the last `keep_last`."""
    raw, ema = full_state(t.raw, t.cfg.fsdp), full_state(t.ema.model, t.cfg.fsdp)
    state = trainer_state(t)
    path = None
    if t.info.is_main and t.out is not None:
        config = {
            "model": to_dict(t.model_cfg),
            "train": to_dict(t.cfg),
            "step": t.step,
            "tokens_seen": t.tokens_seen,
            "last_eval": t.last_eval,
            **t.run_meta,
        }
        path = save_checkpoint(t.out / checkpoint_name(t.step), t.raw, config=config, raw=raw,
                               ema=ema, trainer_state=state, tokenizer=t.tokenizer)
        prune_checkpoints(t.out, t.cfg.keep_last)
    distributed.barrier(t.info)
    t.last_checkpoint = path or t.last_checkpoint
    return path


def read_trainer_state(ckpt: Path, fsdp: bool) -> dict[str, Any]:
    """trainer.pt of `ckpt`, refused when missing, damaged or written with another sharding."""
    state_path = ckpt / "trainer.pt"
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read means a damaged file
        raise AOGPTError(f"trainer state {state_path} is missing or corrupted ({type(exc).__name__})",
                         "resume from an earlier checkpoint with --resume-from") from None
    fix = "resume from an earlier checkpoint with --resume-from"
    if not isinstance(state, dict):
        raise AOGPTError(f"trainer state {state_path} is not a dictionary", fix)
    for key, kind in TRAINER_STATE_KEYS.items():
        if key not in state:
            raise AOGPTError(f"trainer state {state_path} lacks {key!r}", fix)
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise AOGPTError(f"trainer state {state_path}: {key} must be {kind.__name__}, "
                             f"got {type(state[key]).__name__}", fix)
    if state.get("sharding", "replicated") != sharding(fsdp):
        raise AOGPTError(f"{ckpt} was written with {state.get('sharding')} optimizer state, "
                         f"this run is {sharding(fsdp)}", "resume with the same --fsdp setting")
    return state


def resume(t: Trainer, ckpt: Path) -> None:
    """Restore weights, EMA, optimizer and the data/order/dropout streams from a checkpoint."""
    read_config(ckpt)
    tensors = read_weights(ckpt)
    raw, ema = weights_of(tensors, "raw"), {**weights_of(tensors, "raw"), **weights_of(tensors, "ema")}
    state = read_trainer_state(ckpt, t.cfg.fsdp)
    if t.cfg.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        load_full_state(t.raw, raw)
        load_full_state(t.ema.model, ema)
        set_optimizer_state_dict(t.raw, t.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    else:
        load_state_into(t.raw, raw, where=str(ckpt))
        t.ema.load_state_dict(ema, state["ema_updates"])
        t.optimizer.load_state_dict(state["optimizer"])
    t.ema.num_updates = int(state["ema_updates"])
    try:
        t.data_gen.set_state(state["data_gen"])
        t.order_gen.set_state(state["order_gen"].to(t.order_gen.get_state().device))
        torch.set_rng_state(state["torch_rng"])
        if "fim_gen" in state:  # absent in checkpoints written before fill in the middle
            t.fim_gen.set_state(state["fim_gen"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise AOGPTError(f"trainer state {ckpt / 'trainer.pt'} holds damaged random-generator states ({exc})",
                         "resume from an earlier checkpoint with --resume-from") from None
    t.step, t.tokens_seen = int(state["step"]), int(state["tokens_seen"])
    t.train_seconds = float(state["train_seconds"])
    if "loss_window" in state:  # absent in checkpoints written before the window was kept
        t.window.load_state_dict(state["loss_window"])
    t.last_eval = dict(state.get("last_eval", {}))
    t.schedule.load_state_dict(state.get("lr_schedule", {}))  # absent before schedules took decisions
    t.last_checkpoint = ckpt
    t.metrics.truncate(t.step)
