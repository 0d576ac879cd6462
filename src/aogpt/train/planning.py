"""Turn `aogpt train`'s inputs into a checked run, in one pass: configs, data, resume point, process.

`plan(out, data=..., preset=..., ...)` decides in this order: the configs' sources (preset < config
file < overrides (``--set``) < fields by name (the flags)), then a new run, ``init_from`` or a
resume, then the data (it sizes the vocabulary), then the checks of a real run; it returns one frozen
`RunPlan`, and `RunPlan.run()` trains it. `aogpt train` only parses its flags and calls `plan`, so a
Python caller gets the same plan from the same inputs (docs/training.md).

Every user mistake is caught here, before any step runs, and reported as one `AOGPTError` line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.checkpoint import CKPT_PREFIX, find_checkpoint, list_checkpoints, read_config
from aogpt.config import (
    ADAPT_WHY,
    GATED_WHY,
    ModelConfig,
    TrainConfig,
    apply_overrides,
    get_preset,
    load_config_file,
    model_config,
    model_config_from_dict,
    parse_cli_value,
    to_dict,
    train_config,
)
from aogpt.device import resolve_device
from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.io import directory_lock, ensure_writable_dir, remove_stale_temporaries, write_json
from aogpt.memory import check_fits, parameter_count, training_bytes
from aogpt.train import distributed, sizing
from aogpt.train.recipe import left_to_right_share, teacher_cost
from aogpt.train.step import accumulation_steps
from aogpt.train.throughput import flops_per_token
from aogpt.train.trainer import Trainer

MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
TRAIN_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
CONFIG_FIELDS = MODEL_FIELDS | TRAIN_FIELDS

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
DEFAULT_VARIANT = "aogpt"
LOWER_TRAINING = "--batch-size (with --grad-accum to keep the batch), --block-size or the model size (--set model.KEY)"


@dataclass(frozen=True)
class RunPlan:
    """One training run, decided and checked: its configs, its directory, its data, what it resumes.

    Made by `plan`; `run` trains it. `info` is the process this is under torchrun (one process
    without it, and for a dry run); `data` the prepared data (None for a dry run without data)."""

    model_cfg: ModelConfig
    train_cfg: TrainConfig
    info: distributed.DistInfo
    out: Path
    data: Any = field(default=None, compare=False, repr=False)
    resume_from: Path | None = None
    preset: str | None = None
    data_dir: Path | None = None  # absolute
    show_progress: bool = True
    dry_run: bool = False
    recipe_why: str = ""  # why this preset: said on the plan line when a checkpoint carried it
    sizing_why: str = ""  # how `--preset auto` sized the model here (aogpt.train.sizing), for the plan line

    @property
    def tokenizer(self) -> Any:
        return None if self.data is None else self.data.tokenizer

    @property
    def run_meta(self) -> dict[str, Any]:
        """What run.json and every checkpoint record beside the configs."""
        if self.data is None:
            return {}
        return {"tokenizer": self.data.meta.get("tokenizer"), "data": str(self.data_dir), "preset": self.preset}

    def run(self) -> dict[str, Any]:
        """Train: join the process group, build the `Trainer`, resume if asked, write run.json, fit;
        returns the run's summary. Leftovers of a killed run's writes are removed first (unfinished
        checkpoint folders, temporary metrics and run files). Holds the run directory's lock
        (`run_lock`) unless this process already does."""
        if self.dry_run:
            raise AOGPTError("a dry-run plan was not checked for training (device, memory, data)",
                             "make the plan again without dry_run")
        with contextlib.nullcontext() if self.out.absolute() in _HELD else run_lock(self.out):
            return self._train()

    def _train(self) -> dict[str, Any]:
        """Train in the process group (`distributed.run_in_group`): the trainer and its wrapped model
        live in `_fit`'s frame only, so they are gone before the group is left."""
        return distributed.run_in_group(self.info, self._fit)

    def _fit(self) -> dict[str, Any]:
        if self.info.is_main:
            _check_fresh(self.out, self.resume_from)
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


_HELD: set[Path] = set()  # run directories whose lock this process holds (`run_lock`)


@contextlib.contextmanager
def run_lock(out: Path | str, *, dry_run: bool = False) -> Iterator[None]:
    """The run directory's lock (`aogpt.io.directory_lock`), held by the main process from before
    anything in `out` is read until the run ends; none for a dry run, which writes nothing. A run
    directory made here and still empty when the block fails (a refused option) is removed again."""
    if dry_run or int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    out = Path(out)
    existed = out.exists()
    ensure_writable_dir(out)
    try:
        with directory_lock(out, "aogpt train", inside=True):
            _HELD.add(out.absolute())
            try:
                yield
            finally:
                _HELD.discard(out.absolute())
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty
        raise


def section_of(name: str) -> str:
    """The config a field named without a section belongs to: the model's if only it has the
    field, else training's (where an unknown name is then refused)."""
    return "model" if name in MODEL_FIELDS and name not in TRAIN_FIELDS else "train"


def _plain(value: Any) -> Any:
    """A path given from Python as the string a config field holds (``init_from=Path(...)``)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _split_overrides(config: Path | str | None, overrides: Iterable[str],
                     fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(file sections, model overrides, train overrides) from the config file, the overrides (--set)
    and the fields given by name (the flags), a later one winning."""
    file_data = load_config_file(Path(config)) if config else {}
    model_over = dict(file_data.get("model", {}))
    train_over = dict(file_data.get("train", {}))
    for item in [overrides] if isinstance(overrides, str) else overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise AOGPTError(f"--set {item!r} is not KEY=VALUE", "write e.g. --set model.n_layer=6")
        section, _, name = key.rpartition(".")
        if section not in ("", "model", "train"):
            raise AOGPTError(f"--set {key}: unknown section {section!r}", "use model.KEY or train.KEY")
        if not section:
            section = section_of(name)
        (model_over if section == "model" else train_over)[name] = parse_cli_value(value)
    for name, value in fields.items():
        section = section_of(name)
        if value is not None:
            (model_over if section == "model" else train_over)[name] = _plain(value)
    for key in ("preset", "variant"):
        if key in file_data and not isinstance(file_data[key], str):
            raise AOGPTError(f"config file {config}: {key} must be a string", "fix the file")
    return file_data, model_over, train_over


def _start_config(init_from: Any) -> dict[str, Any]:
    return read_config(find_checkpoint(Path(init_from))) if init_from else {}


def carried_recipe(init_from: Any, given_preset: str | None) -> tuple[str | None, str]:
    """The preset a checkpoint to start from carries (`aogpt adapt` writes ``recipe``), used when no
    preset is given, and the plan line's reason for it ("" when none applies)."""
    if given_preset or not init_from:
        return None, ""
    recipe = _start_config(init_from).get("recipe")
    if not isinstance(recipe, str):
        return None, ""
    get_preset(recipe)  # a name this version knows
    why = {"adapt": ADAPT_WHY, "adapt-gated": GATED_WHY}.get(recipe, "the preset the checkpoint names")
    return recipe, f"recipe: {recipe}, carried by {init_from} ({why}); --preset NAME picks another"


def carried_variant(init_from: Any) -> str | None:
    """The variant of the checkpoint to start from, so `--init-from` alone needs no `--variant`."""
    model = _start_config(init_from).get("model") if init_from else None
    return model.get("variant") if isinstance(model, dict) else None


def _differs(cfg: ModelConfig, asked: dict[str, Any]) -> set[str]:
    """The fields asked for that `cfg` does not have as asked."""
    return {k for k, v in asked.items() if getattr(cfg, k, None) != v}


def _resume_configs(ckpt: Path, preset: str | None, variant: str | None, model_over: dict[str, Any],
                    train_over: dict[str, Any],
                    extend_to: int | None) -> tuple[ModelConfig, TrainConfig, dict[str, Any]]:
    """The saved configs of `ckpt` with the changes a resume allows; anything else is refused."""
    saved = read_config(ckpt)
    if not isinstance(saved.get("train"), dict) or not (ckpt / "trainer.pt").is_file():
        raise AOGPTError(f"{ckpt} holds no training state (it was imported, or saved for inference only)",
                         f"start a new run from its weights: --init-from {ckpt}")
    model_cfg = model_config_from_dict(saved["model"])
    changed = _differs(model_cfg, {**model_over, **({"variant": variant} if variant else {})}) - {"block_size"}
    if changed:
        raise AOGPTError(
            f"cannot change the model when resuming ({', '.join(sorted(changed))})",
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
    if extend_to is not None:
        if extend_to <= step:
            raise AOGPTError(f"--extend-to {extend_to} is not past the checkpoint's step {step}",
                             f"pass a step above {step}")
        train_cfg = dataclasses.replace(train_cfg, schedule_steps=train_cfg.decay_steps, max_steps=extend_to)
    elif step >= train_cfg.max_steps:
        raise AOGPTError(f"{ckpt} is the end of its run (step {step} of {train_cfg.max_steps})",
                         "pass --extend-to N to train on past it")
    return model_cfg, train_cfg.validate(), saved


def plan(out: Path | str, *, data: Path | str | None = None, preset: str | None = None, variant: str | None = None,
         config: Path | str | None = None, overrides: Iterable[str] = (), resume: bool = False,
         resume_from: Path | str | None = None, extend_to: int | None = None, dry_run: bool = False,
         show_progress: bool = True, **fields: Any) -> RunPlan:
    """Resolve and check one training run (see the module's docstring); `RunPlan.run()` trains it.

    out: the run directory. data: a prepared data directory (`aogpt prepare`; a resumed run reuses
    its own). The configs, a later source winning: preset (default cpu-small), config (a JSON/TOML
    file with ``[model]``, ``[train]``, ``preset``, ``variant``), overrides (``--set`` items,
    ``"model.n_layer=6"``; a key without a section is the model's if only the model has it) and
    `fields`: any `ModelConfig` / `TrainConfig` field by name (``lr=3e-3, block_size=64``; None: not
    given), as the flags are. variant (default aogpt) picks the family's defaults. resume continues
    the newest checkpoint in `out`, resume_from a given one; extend_to (with a resume) trains on to
    that step. dry_run: decide the configs only (no data needed, nothing checked for training).
    Reads `out` without writing it: hold `run_lock(out)` around `plan` and `run` to keep a second
    writer out from the start (`aogpt train` does; `run` takes the lock itself otherwise).
    """
    out = Path(out)
    file_data, model_over, train_over = _split_overrides(config, overrides, fields)
    given_preset = preset or file_data.get("preset")
    resuming = bool(resume or resume_from)
    if extend_to is not None and not resuming:
        raise AOGPTError("--extend-to continues a run", "add --resume (or --resume-from CKPT), or use --max-steps")
    asked_from, resume_from = resume_from, None
    recipe_why = ""
    if resuming:
        resume_from = find_checkpoint(Path(asked_from or out))
        model_cfg, train_cfg, saved = _resume_configs(resume_from, given_preset, variant, model_over, train_over,
                                                      extend_to)
        preset = saved.get("preset", given_preset)
        data_dir = data or (Path(saved["data"]) if saved.get("data") else None)
    else:
        carried, recipe_why = carried_recipe(train_over.get("init_from"), given_preset)
        preset = given_preset or carried or DEFAULT_PRESET
        overridden = model_over.pop("variant", None)  # --set model.variant, or [model] variant in the file
        variant = variant or overridden or file_data.get("variant") or carried_variant(train_over.get("init_from")) \
            or DEFAULT_VARIANT
        model_cfg = model_config(variant, preset=preset, **{k: v for k, v in model_over.items() if k != "vocab_size"})
        train_cfg = train_config(preset, variant, **train_over)
        data_dir = data
        if train_cfg.init_from:
            source = model_config_from_dict(read_config(find_checkpoint(Path(train_cfg.init_from)))["model"])
            wanted = model_over.get("block_size", source.block_size)
            if _differs(source, {"variant": variant, "block_size": wanted}):
                raise AOGPTError(
                    f"--init-from model (variant {source.variant}, block size {source.block_size}) does "
                    f"not fit variant {variant} with block size {wanted}",
                    "match --variant and keep the model's block size",
                )
            model_cfg = source
    family(model_cfg.variant).check_order(train_cfg.order)  # an order the variant can read
    _check_fim(model_cfg, train_cfg, resuming)
    if train_cfg.freeze_backbone_steps and not family(model_cfg.variant).target_position:
        raise AOGPTError(f"variant {model_cfg.variant} has no target pathway to train while the backbone is frozen",
                         "drop freeze_backbone_steps, or train an any-order variant")

    data = None
    if data_dir is None:
        if not dry_run:
            raise AOGPTError("no training data given", "pass --data DIR (make one with `aogpt prepare`)")
        if "vocab_size" in model_over and resume_from is None:  # no tokenizer to size it: as asked
            model_cfg = apply_overrides(model_cfg, {"vocab_size": model_over["vocab_size"]}, "model config").validate()
    else:
        from aogpt.data import PreparedData

        start = resume_from or (find_checkpoint(Path(train_cfg.init_from)) if train_cfg.init_from else None)
        expected = read_config(start).get("tokenizer") if start else None
        data = PreparedData(Path(data_dir), expect_tokenizer=expected)
        if expected == "hf":  # a pretrained model's own tokenizer: the same one, not only the same kind
            from aogpt.data.tokenizer import checkpoint_tokenizer

            if checkpoint_tokenizer(start).to_json() != data.tokenizer.to_json():
                raise AOGPTError(f"{data_dir} was prepared with another tokenizer than {start}'s",
                                 f"prepare the data with `aogpt prepare --tokenizer {start}`")
        model_cfg = _fit_vocab(model_cfg, data, model_over, start is not None, fim=train_cfg.fim_rate > 0)
        for split in ("train", "val"):
            if data.num_tokens(split) < model_cfg.block_size:
                raise AOGPTError(
                    f"the {split} split of {data_dir} holds {data.num_tokens(split)} tokens, fewer "
                    f"than one block of {model_cfg.block_size}",
                    "use a smaller --block-size or more data",
                )
        data_dir = Path(data_dir).resolve()

    if dry_run:
        return RunPlan(model_cfg, train_cfg, distributed.DistInfo(), out, data, resume_from, preset, data_dir,
                       show_progress, dry_run=True, recipe_why=recipe_why)
    if train_cfg.fsdp and not distributed.launched_by_torchrun():
        raise AOGPTError("--fsdp shards the model over several processes", "launch with torchrun, or drop --fsdp")
    device = resolve_device(train_cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
    sizing_why = ""
    if preset == sizing.AUTO_PRESET and resume_from is None and not train_cfg.init_from:
        model_cfg, train_cfg, sizing_why = _sized(model_cfg, train_cfg, model_over, train_over, device)
    world = int(os.environ.get("WORLD_SIZE", 1))
    sharers = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if device.type == "cpu" else 1
    check_fits(training_bytes(model_cfg, train_cfg.batch_size, world, train_cfg.fsdp), device,
               "training", LOWER_TRAINING, processes=sharers)
    data.check_token_ids(model_cfg.vocab_size)  # once, before the first step (not on every batch)
    _check_fresh(out, resume_from)
    info = distributed.process_info(device.type)
    return RunPlan(model_cfg, train_cfg, info, out, data, resume_from, preset, data_dir, show_progress,
                   recipe_why=recipe_why, sizing_why=sizing_why)


def _sized(model_cfg: ModelConfig, train_cfg: TrainConfig, model_over: dict[str, Any], train_over: dict[str, Any],
           device: Any) -> tuple[ModelConfig, TrainConfig, str]:
    """`--preset auto`: width, heads and the curriculum's stages chosen for this machine's compute in the
    time budget (`aogpt.train.sizing`); a field the user gave is kept as given, and sizing is skipped
    when they gave the width."""
    if "n_embd" in model_over or "n_head" in model_over:
        return model_cfg, train_cfg, "size: as given (--set n_embd / n_head), not sized by --preset auto"
    if train_cfg.max_minutes <= 0:
        raise AOGPTError("--preset auto sizes the model to a time budget, and none was given",
                         "pass --max-minutes M (the preset's default is 10), or use --preset quickstart")
    kept = {k: v for k, v in model_over.items() if k != "vocab_size"}
    choice = sizing.choose_size(model_cfg.variant, kept, train_cfg, vocab_size=model_cfg.vocab_size, device=device)
    model_cfg = apply_overrides(model_cfg, choice.model_fields(), "model config").validate()
    fields = {"extra": {**train_cfg.extra, "sizing": choice.measured}}
    if "curriculum" not in train_over:
        fields["curriculum"] = choice.curriculum
    train_cfg = apply_overrides(train_cfg, fields, "train config").validate()
    return model_cfg, train_cfg, choice.why


def _check_fresh(out: Path, resume_from: Path | None) -> None:
    """A new run never writes over another run's checkpoints."""
    if resume_from is None and list_checkpoints(out):
        raise AOGPTError(f"{out} already holds checkpoints", "pass --resume to continue it, or choose a new --out")


def _check_fim(model_cfg: ModelConfig, train_cfg: TrainConfig, resuming: bool) -> None:
    """Fill in the middle trains a left-to-right model whose vocabulary holds the sentinels: a new run
    gets them from the data (`_fit_vocab`); a run started from a checkpoint must have them already."""
    if train_cfg.fim_rate <= 0:
        return
    fam = family(model_cfg.variant)
    if fam.any_order or not fam.causal:
        raise AOGPTError(f"--fim-rate trains a left-to-right model to fill in the middle; variant {model_cfg.variant} "
                         "reads other orders itself", "use --variant gpt, or drop --fim-rate")
    if (resuming or train_cfg.init_from) and model_cfg.fim_tokens is None:
        raise AOGPTError("the checkpoint to start from has no fill-in-the-middle sentinels in its vocabulary",
                         "train a new run with --fim-rate, or start from a run trained with it")


def _fit_vocab(cfg: ModelConfig, data: Any, model_over: dict[str, Any], resuming: bool,
               fim: bool = False) -> ModelConfig:
    """Size the embedding for the data's tokenizer (and, for a new fill-in-the-middle run, its four
    sentinels after the tokenizer's ids: `aogpt.data.fim`); refuse a model too small for the data."""
    tokenizer = data.tokenizer
    if fim and not resuming and cfg.fim_tokens is None:
        from aogpt.data.fim import with_sentinels

        tokenizer = with_sentinels(tokenizer)
        cfg = dataclasses.replace(cfg, fim_tokens=tokenizer.sentinels.to_list())
    need = int(tokenizer.vocab_size)
    if resuming or "vocab_size" in model_over:
        have = cfg.vocab_size if resuming else model_over["vocab_size"]
        # a bad value gets its own error first (the sentinels are checked against the size below)
        apply_overrides(dataclasses.replace(cfg, fim_tokens=None), {"vocab_size": have}, "model config").validate()
        if have < need:
            raise AOGPTError(
                f"the data was made with tokenizer {data.meta.get('tokenizer')} ({need} tokens"
                f"{' with the fill-in-the-middle sentinels' if cfg.fim_tokens else ''}) but the "
                f"model's vocabulary holds {have}",
                "prepare the data with the model's tokenizer" if not fim else "raise model.vocab_size",
            )
        return apply_overrides(cfg, {"vocab_size": have}, "model config").validate()
    return apply_overrides(cfg, {"vocab_size": int(tokenizer.padded_vocab_size)}, "model config").validate()


def dry_run_report(plan: RunPlan, assume_tflops: float) -> dict[str, Any]:
    """Sizes, batch arithmetic, a memory estimate per device and the time per step at a throughput."""
    cfg, tc = plan.model_cfg, plan.train_cfg
    n_params = parameter_count(cfg)
    world = plan.info.world_size
    accum = accumulation_steps(tc, world, cfg.block_size)
    tokens_per_step = world * tc.batch_size * accum * cfg.block_size
    teacher_bytes, teacher_flops = teacher_cost(tc, n_params)  # distillation's frozen start (aogpt.train.recipe)
    memory = training_bytes(cfg, tc.batch_size, world, tc.fsdp, params=n_params) + teacher_bytes
    T, d, L = cfg.block_size, cfg.n_embd, cfg.n_layer
    fpt = flops_per_token(cfg, T) * (1.0 + teacher_flops)
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
        "recipe": plan.preset or "-",
        "lr": tc.lr,
        "backbone / target pathway lr": f"{tc.lr * tc.backbone_lr_mult:g} / {tc.lr * tc.target_lr_mult:g}",
        "left-to-right share (replay)": f"{left_to_right_share(tc):.3f} ({tc.replay_l2r:g})"
        + (f"; {left_to_right_share(tc, tc.hold_floor):.3f} with the hold at its floor" if tc.hold_floor < 1 else ""),
        "distillation (KL weight)": f"{tc.distill_l2r:g}" + (f", teacher {teacher_bytes / 2**30:.2f} GiB"
                                                              if teacher_bytes else ""),
        "ema decay": tc.ema_decay,
        "max steps": tc.max_steps,
        "memory per device (GiB)": round(memory / 2**30, 2),
        "training FLOPs per token": f"{fpt:.3e}",
        "time per step (s)": f"{seconds:.3f} at {assume_tflops:g} TFLOP/s per device",
        "time for max steps (h)": round(seconds * tc.max_steps / 3600, 1),
    }
