"""Turn `aogpt train` arguments into a checked run: configs, data, resume point, process group.

Every user mistake is caught here, before any step runs, and reported as one `AOGPTError` line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.checkpoint import CKPT_PREFIX, find_checkpoint, list_checkpoints, read_config
from aogpt.config import (
    ModelConfig,
    TrainConfig,
    apply_overrides,
    load_config_file,
    model_config,
    model_config_from_dict,
    parse_cli_value,
    to_dict,
    train_config,
)
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.io import directory_lock, ensure_writable_dir, remove_stale_temporaries, write_json
from aogpt.memory import check_fits, parameter_count, training_bytes
from aogpt.train import distributed

FLAG_FIELDS = {  # flag dest -> (section, field)
    "max_steps": ("train", "max_steps"),
    "max_minutes": ("train", "max_minutes"),
    "seed": ("train", "seed"),
    "order": ("train", "order"),
    "batch_size": ("train", "batch_size"),
    "grad_accum": ("train", "grad_accum"),
    "global_batch_tokens": ("train", "global_batch_tokens"),
    "lr": ("train", "lr"),
    "eval_interval": ("train", "eval_interval"),
    "ckpt_interval": ("train", "ckpt_interval"),
    "ema_decay": ("train", "ema_decay"),
    "device": ("train", "device"),
    "dtype": ("train", "dtype"),
    "compile": ("train", "compile"),
    "fsdp": ("train", "fsdp"),
    "init_from": ("train", "init_from"),
    "keep_last": ("train", "keep_last"),
    "block_size": ("model", "block_size"),
}

TRAIN_ONLY_ON_RESUME = {  # logistics: changing them on resume does not change what is computed
    "max_minutes",
    "eval_interval",
    "ckpt_interval",
    "keep_last",
    "log_interval",
    "device",
    "dtype",
    "compile",
    "eval_batches",
}
DEFAULT_PRESET = "cpu-small"
LOWER_TRAINING = "--batch-size (with --grad-accum to keep the batch), --block-size or the model size (--set model.KEY)"


@dataclass
class Plan:
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    info: distributed.DistInfo
    out: Path
    data: Any = None
    tokenizer: Any = None
    resume_from: Path | None = None
    run_meta: dict[str, Any] = field(default_factory=dict)
    show_progress: bool = True

    def run(self) -> dict[str, Any]:
        """Train (the caller holds the run directory's lock, `train_lock`). Leftovers of a killed run's
        writes are removed first: unfinished checkpoint folders, temporary metrics and run files."""
        from aogpt.train import Trainer

        try:
            if self.info.is_main:
                removed = remove_stale_temporaries(self.out, CKPT_PREFIX)
                for name in ("metrics.jsonl", "run.json"):
                    remove_stale_temporaries(self.out, name)
                if removed:
                    print(f"removed {len(removed)} unfinished checkpoint folder(s) of an interrupted run",
                          file=sys.stderr)
            trainer = Trainer(
                self.model_cfg,
                self.train_cfg,
                self.data,
                self.out,
                info=self.info,
                run_meta=self.run_meta,
                tokenizer=self.tokenizer,
                show_progress=self.show_progress,
            )
            if self.resume_from is not None:
                trainer.resume(self.resume_from)
            if self.info.is_main:
                write_json(
                    self.out / "run.json",
                    {"model": to_dict(self.model_cfg), "train": to_dict(self.train_cfg), **self.run_meta},
                )
            return trainer.fit()
        finally:
            distributed.shutdown()


@contextlib.contextmanager
def train_lock(args: argparse.Namespace) -> Iterator[None]:
    """The run directory's lock (`aogpt.io.directory_lock`), held by the main process from before
    anything in --out is read until the run ends; none for --dry-run, which writes nothing. A run
    directory made here and still empty when the command fails (a refused flag) is removed again."""
    if args.dry_run or int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    existed = Path(args.out).exists()
    ensure_writable_dir(args.out)
    try:
        with directory_lock(args.out, "aogpt train", inside=True):
            yield
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                Path(args.out).rmdir()  # only if empty
        raise


def _split_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(file sections, model overrides, train overrides) from --config, --set and the flags."""
    file_data = load_config_file(args.config) if args.config else {}
    model_over = dict(file_data.get("model", {}))
    train_over = dict(file_data.get("train", {}))
    model_fields = set(ModelConfig.__dataclass_fields__)
    train_fields = set(TrainConfig.__dataclass_fields__)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise AOGPTError(f"--set {item!r} is not KEY=VALUE", "write e.g. --set model.n_layer=6")
        section, _, name = key.rpartition(".")
        if section not in ("", "model", "train"):
            raise AOGPTError(f"--set {key}: unknown section {section!r}", "use model.KEY or train.KEY")
        if not section:
            section = "model" if name in model_fields and name not in train_fields else "train"
        (model_over if section == "model" else train_over)[name] = parse_cli_value(value)
    for dest, (section, name) in FLAG_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            (model_over if section == "model" else train_over)[name] = value
    for key in ("preset", "variant"):
        if key in file_data and not isinstance(file_data[key], str):
            raise AOGPTError(f"config file {args.config}: {key} must be a string", "fix the file")
    return file_data, model_over, train_over


def _resume_configs(args: argparse.Namespace, ckpt: Path, preset: str | None, model_over: dict[str, Any],
                    train_over: dict[str, Any]) -> tuple[ModelConfig, TrainConfig, dict[str, Any]]:
    """The saved configs of `ckpt` with the changes a resume allows; anything else is refused."""
    saved = read_config(ckpt)
    if not isinstance(saved.get("train"), dict) or not (ckpt / "trainer.pt").is_file():
        raise AOGPTError(f"{ckpt} holds no training state (it was imported, or saved for inference only)",
                         f"start a new run from its weights: --init-from {ckpt}")
    model_cfg = model_config_from_dict(saved["model"])
    changed = {k for k, v in model_over.items() if getattr(model_cfg, k, None) != v and k != "block_size"}
    if changed or (args.variant and args.variant != model_cfg.variant):
        raise AOGPTError(
            f"cannot change the model when resuming ({', '.join(sorted(changed)) or 'variant'})",
            "drop those overrides, or start a new run with --init-from",
        )
    if preset is not None and preset != saved.get("preset", preset):
        raise AOGPTError(f"cannot change the preset when resuming (the run used {saved.get('preset')}, not {preset})",
                         "drop --preset: a resumed run keeps its recipe")
    if "max_steps" in train_over and train_over["max_steps"] != saved["train"].get("max_steps"):
        raise AOGPTError(
            "cannot change max_steps when resuming (the learning-rate schedule ends there: the run would not "
            "continue exactly)", "pass --extend-to N to train on past it at the final learning rate")
    bad = set(train_over) - TRAIN_ONLY_ON_RESUME - {k for k, v in train_over.items() if saved["train"].get(k) == v}
    if bad:
        raise AOGPTError(
            f"cannot change {', '.join(sorted(bad))} when resuming (the run would not continue exactly)",
            f"only these may change: {', '.join(sorted(TRAIN_ONLY_ON_RESUME))}",
        )
    train_cfg = apply_overrides(
        apply_overrides(TrainConfig(), saved["train"], "checkpoint train config"), train_over, "train config"
    )
    step = int(saved.get("step", 0))
    if args.extend_to is not None:
        if args.extend_to <= step:
            raise AOGPTError(f"--extend-to {args.extend_to} is not past the checkpoint's step {step}",
                             f"pass a step above {step}")
        train_cfg = dataclasses.replace(train_cfg, schedule_steps=train_cfg.decay_steps, max_steps=args.extend_to)
    elif step >= train_cfg.max_steps:
        raise AOGPTError(f"{ckpt} is the end of its run (step {step} of {train_cfg.max_steps})",
                         "pass --extend-to N to train on past it")
    return model_cfg, train_cfg.validate(), saved


def prepare_run(args: argparse.Namespace) -> Plan:
    file_data, model_over, train_over = _split_overrides(args)
    given_preset = args.preset or file_data.get("preset")
    resuming = bool(args.resume or args.resume_from)
    if args.extend_to is not None and not resuming:
        raise AOGPTError("--extend-to continues a run", "add --resume (or --resume-from CKPT), or use --max-steps")
    resume_from = None
    if resuming:
        resume_from = find_checkpoint(args.resume_from or args.out)
        model_cfg, train_cfg, saved = _resume_configs(args, resume_from, given_preset, model_over, train_over)
        preset = saved.get("preset", given_preset)
        data_dir = args.data or (Path(saved["data"]) if saved.get("data") else None)
    else:
        preset = given_preset or DEFAULT_PRESET
        variant = args.variant or file_data.get("variant", "aogpt")
        model_cfg = model_config(variant, preset=preset, **{k: v for k, v in model_over.items() if k != "vocab_size"})
        train_cfg = train_config(preset, variant, **train_over)
        data_dir = args.data
        if train_cfg.init_from:
            source = model_config_from_dict(read_config(find_checkpoint(Path(train_cfg.init_from)))["model"])
            wanted = model_over.get("block_size", source.block_size)
            if source.variant != variant or wanted != source.block_size:
                raise AOGPTError(
                    f"--init-from model (variant {source.variant}, block size {source.block_size}) does "
                    f"not fit variant {variant} with block size {wanted}",
                    "match --variant and keep the model's block size",
                )
            model_cfg = source

    data, tokenizer = None, None
    if data_dir is None:
        if not args.dry_run:
            raise AOGPTError("no training data given", "pass --data DIR (make one with `aogpt prepare`)")
    else:
        from aogpt.data import PreparedData

        expected = read_config(resume_from).get("tokenizer") if resume_from else None
        data = PreparedData(Path(data_dir), expect_tokenizer=expected)
        tokenizer = data.tokenizer
        model_cfg = _fit_vocab(model_cfg, data, model_over, resume_from is not None)
        for split in ("train", "val"):
            if data.num_tokens(split) < model_cfg.block_size:
                raise AOGPTError(
                    f"the {split} split of {data_dir} holds {data.num_tokens(split)} tokens, fewer "
                    f"than one block of {model_cfg.block_size}",
                    "use a smaller --block-size or more data",
                )

    if args.dry_run:
        return Plan(model_cfg, train_cfg, distributed.DistInfo(), args.out, data, tokenizer)
    if train_cfg.fsdp and not distributed.launched_by_torchrun():
        raise AOGPTError("--fsdp shards the model over several processes", "launch with torchrun, or drop --fsdp")
    device = resolve_device(train_cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
    world = int(os.environ.get("WORLD_SIZE", 1))
    sharers = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if device.type == "cpu" else 1
    check_fits(training_bytes(model_cfg, train_cfg.batch_size, world, train_cfg.fsdp), device,
               "training", LOWER_TRAINING, processes=sharers)
    data.check_token_ids(model_cfg.vocab_size)  # once, before the first step (not on every batch)
    if resume_from is None and list_checkpoints(args.out):
        raise AOGPTError(f"{args.out} already holds checkpoints", "pass --resume to continue it, or choose a new --out")
    info = distributed.init_distributed(device.type)
    meta = {
        "tokenizer": data.meta.get("tokenizer"),
        "data": str(Path(data_dir).resolve()),
        "preset": preset,
    }
    return Plan(
        model_cfg, train_cfg, info, args.out, data, tokenizer, resume_from, meta, show_progress=not args.no_progress
    )


def _fit_vocab(cfg: ModelConfig, data: Any, model_over: dict[str, Any], resuming: bool) -> ModelConfig:
    """Size the embedding for the data's tokenizer; refuse a model too small for the data."""
    need = int(data.tokenizer.vocab_size)
    if resuming or "vocab_size" in model_over:
        have = cfg.vocab_size if resuming else model_over["vocab_size"]
        cfg = apply_overrides(cfg, {"vocab_size": have}, "model config").validate()
        if have < need:
            raise AOGPTError(
                f"the data was made with tokenizer {data.meta.get('tokenizer')} ({need} tokens) but the "
                f"model's vocabulary holds {have}",
                "prepare the data with the model's tokenizer",
            )
        return apply_overrides(cfg, {"vocab_size": have}, "model config")
    return apply_overrides(cfg, {"vocab_size": int(data.tokenizer.padded_vocab_size)}, "model config")


def dry_run_report(plan: Plan, assume_tflops: float) -> dict[str, Any]:
    """Sizes, batch arithmetic, a memory estimate per device and the time per step at a throughput."""
    from aogpt.train import accumulation_steps, flops_per_token

    cfg, tc = plan.model_cfg, plan.train_cfg
    n_params = parameter_count(cfg)
    world = plan.info.world_size
    accum = accumulation_steps(tc, world, cfg.block_size)
    tokens_per_step = world * tc.batch_size * accum * cfg.block_size
    memory = training_bytes(cfg, tc.batch_size, world, tc.fsdp, params=n_params)
    T, d, L = cfg.block_size, cfg.n_embd, cfg.n_layer
    fpt = flops_per_token(cfg, T)
    seconds = fpt * tokens_per_step / (assume_tflops * 1e12 * world)
    return {
        "variant": cfg.variant,
        "parameters": n_params,
        "layers/width/heads": f"{L}/{d}/{cfg.n_head}",
        "block size": T,
        "vocab": cfg.vocab_size,
        "world size": world,
        "micro-batch (seqs)": tc.batch_size,
        "accumulation steps": accum,
        "tokens per step": tokens_per_step,
        "order": tc.order,
        "lr": tc.lr,
        "ema decay": tc.ema_decay,
        "max steps": tc.max_steps,
        "memory per device (GiB)": round(memory / 2**30, 2),
        "training FLOPs per token": f"{fpt:.3e}",
        "time per step (s)": f"{seconds:.3f} at {assume_tflops:g} TFLOP/s per device",
        "time for max steps (h)": round(seconds * tc.max_steps / 3600, 1),
    }
