"""Checkpoints: self-contained directories, written atomically, loaded without unpickling.

Layout of one checkpoint directory (``RUN/ckpt-0001000``)::

    model.safetensors   raw weights under "raw.<name>", EMA weights under "ema.<name>"
                        (a tied output head is stored once, as its embedding)
    config.json         {"format", "model": ModelConfig, "train": TrainConfig, "tokenizer", "step", ...}
    tokenizer/          the tokenizer's files (a trained BPE travels with the model)
    trainer.pt          optimizer, RNG and data-sampler state for --resume (tensors and plain
                        containers only: read with weights_only=True)

A run directory holds several ``ckpt-*`` directories; `find_checkpoint` picks the newest complete
one. Each is written to a temporary name and renamed, so a crash never leaves a half-written
checkpoint in place of a good one.

`load` also reads a Hugging Face folder written by ``aogpt export --format hf`` (its config.json
says ``"model_type": "aogpt"``; one set of weights), without importing transformers.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aogpt.config import ModelConfig, model_config_from_dict, to_dict
from aogpt.errors import AOGPTError
from aogpt.families import unwrap
from aogpt.io import atomic_dir, read_json, write_json
from aogpt.model import Transformer
from aogpt.pathway import is_gated
from aogpt.validation import require

FORMAT = "aogpt-checkpoint/1"
CKPT_PREFIX = "ckpt-"
HF_MODEL_TYPE = "aogpt"  # config.json of a Hugging Face folder (`aogpt.hf`)
HF_WEIGHTS = "model"  # its weights are "model.<name>": the Transformer is AOGPTForCausalLM.model


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without aliases: a tied head is the embedding's parameter, stored once."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    state = model.state_dict()
    return {n: state[n] for n in names if n in state}


def checkpoint_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:07d}"


def save_checkpoint(directory: Path, model: torch.nn.Module, *, config: dict[str, Any],
                    ema: dict[str, torch.Tensor] | None = None, trainer_state: dict[str, Any] | None = None,
                    tokenizer: Any = None, raw: dict[str, torch.Tensor] | None = None) -> Path:
    """Write a checkpoint directory atomically. `config` must hold "model" (a dict) at least.

    `raw` (and `ema`) may be full state dicts gathered elsewhere (FSDP); only the names of
    `unique_state(model)` are stored.
    """
    directory = Path(directory)
    names = unique_state(model).keys()
    raw = unique_state(model) if raw is None else raw
    core = unwrap(model)
    if is_gated(core):  # which weights are the pathway's (they train; the rest is the frozen source)
        config = {**config, "pathway": {"trained": [n for n, p in core.named_parameters() if p.requires_grad]}}
    with atomic_dir(directory) as tmp:
        tensors = {f"raw.{k}": raw[k].detach().cpu().contiguous() for k in names}
        if ema is not None:
            tensors.update({f"ema.{k}": v.detach().cpu().contiguous() for k, v in ema.items()
                            if f"raw.{k}" in tensors})
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        write_json(tmp / "config.json", {"format": FORMAT, **config})
        if tokenizer is not None:
            (tmp / "tokenizer").mkdir()
            tokenizer.save(tmp / "tokenizer")
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer.pt")
    return directory


def list_checkpoints(run: Path) -> list[Path]:
    """Complete checkpoint directories of a run, oldest first."""
    run = Path(run)
    found = [p for p in run.glob(f"{CKPT_PREFIX}*") if p.is_dir() and (p / "config.json").is_file()
             and (p / "model.safetensors").is_file()]
    return sorted(found, key=lambda p: p.name)


def find_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the newest complete checkpoint inside a run directory."""
    path = Path(path)
    if not path.exists():
        raise AOGPTError(f"checkpoint {path} does not exist", "pass a run directory or a ckpt-* directory")
    if (path / "model.safetensors").is_file():
        return path
    found = list_checkpoints(path)
    if not found:
        raise AOGPTError(f"no checkpoint found in {path}", "train first, or pass a ckpt-* directory")
    return found[-1]


def prune_checkpoints(run: Path, keep_last: int) -> None:
    for old in list_checkpoints(run)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def read_config(ckpt: Path) -> dict[str, Any]:
    """config.json of a checkpoint, its shape checked: a missing key or a wrong type is one user
    error naming it (the model section itself is checked by `model_config_from_dict`)."""
    path = Path(ckpt) / "config.json"
    cfg = read_json(path, what="checkpoint config")
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise AOGPTError(f"{ckpt} is not an aogpt checkpoint (config.json lacks format {FORMAT})",
                         "use `aogpt import` for the paper's .pt files")
    fix = "the checkpoint's config.json is damaged: use another checkpoint of the run"
    require(cfg, "model", dict, str(path), fix)
    for key, kind in CONFIG_KEYS.items():
        if key in cfg and cfg[key] is not None and (not isinstance(cfg[key], kind) or isinstance(cfg[key], bool)):
            raise AOGPTError(f"{path}: {key} must be {kind.__name__}, got {cfg[key]!r}", fix)
    if isinstance(cfg.get("step"), int) and cfg["step"] < 0:
        raise AOGPTError(f"{path}: step must be >= 0, got {cfg['step']}", fix)
    return cfg


CONFIG_KEYS = {"train": dict, "step": int, "tokenizer": str, "data": str, "preset": str, "last_eval": dict}


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    path = Path(ckpt) / "model.safetensors"
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AOGPTError(f"checkpoint weights {path} are corrupted or truncated ({exc})",
                         "use an earlier checkpoint of the run") from None


def weights_of(tensors: dict[str, torch.Tensor], which: str) -> dict[str, torch.Tensor]:
    prefix = f"{which}."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_state_into(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load `state` strictly (a tied head may be absent), naming every mismatch."""
    expected = unique_state(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(model.state_dict()))
    bad_shapes = [f"{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
                  if k in state and state[k].shape != v.shape]
    if missing or unexpected or bad_shapes:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:5])}" + (" ..." if len(unexpected) > 5 else ""))
        if bad_shapes:
            parts.append(f"shape mismatch {'; '.join(bad_shapes[:5])}")
        raise AOGPTError(f"{where} does not fit the model: {' / '.join(parts)}",
                         "check the checkpoint and its config.json")
    model.load_state_dict(state, strict=False)


@dataclass
class Loaded:
    """What `aogpt.load` returns: the model (eval mode), its tokenizer and configs."""

    model: Transformer
    tokenizer: Any
    config: ModelConfig
    train_config: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    path: Path | None = None
    weights: str = "ema"
    meta: dict[str, Any] = field(default_factory=dict)

    def generate(self, **kwargs: Any) -> Any:
        """Sample sequences; see `aogpt.generation.generate.generate` for the arguments."""
        from aogpt.generation.generate import generate

        return generate(self.model, tokenizer=self.tokenizer, **kwargs)

    def infill(self, template: Any, **kwargs: Any) -> Any:
        """Fill the blanks of a template; see `aogpt.generation.generate.infill` (a fill-in-the-middle
        GPT: `aogpt.generation.fim.fim_fill`)."""
        if self.config.fim_tokens:
            from aogpt.generation.fim import fim_fill

            return fim_fill(self.model, template, tokenizer=self.tokenizer, **kwargs)
        from aogpt.generation.generate import infill

        return infill(self.model, template, tokenizer=self.tokenizer, **kwargs)


def save(model: torch.nn.Module, path: str | Path, *, tokenizer: Any = None,
         ema: torch.nn.Module | dict[str, torch.Tensor] | None = None, step: int = 0,
         extra: dict[str, Any] | None = None) -> Path:
    """Write an in-memory model as a checkpoint directory that `load` reads (atomically).

    tokenizer: saved beside the weights (so `load(...).generate` returns text). ema: EMA weights (a
    model or a state dict); without them the checkpoint records that it has none, and `load`'s
    default (EMA weights) reads the model's own. extra: more JSON-friendly fields for config.json.
    """
    core = unwrap(model)
    if getattr(core, "config", None) is None or not hasattr(core, "forward_slots"):
        raise AOGPTError(f"{type(model).__name__} is not an aogpt model", "save an aogpt Transformer")
    ema_state = None if ema is None else unique_state(unwrap(ema)) if isinstance(ema, torch.nn.Module) else dict(ema)
    config = {**(extra or {}), "model": to_dict(core.config), "step": int(step), "has_ema": ema is not None,
              "tokenizer": getattr(tokenizer, "spec", None)}
    return save_checkpoint(Path(path), core, config=config, ema=ema_state, tokenizer=tokenizer)


def load(path: str | Path, weights: str = "ema", device: str | torch.device = "cpu",
         dtype: torch.dtype | str = torch.float32) -> Loaded:
    """Load a checkpoint (or a run's newest one) for evaluation and generation.

    weights: "ema" (default; falls back to raw weights with a clear error if none were saved) or
    "raw". dtype: the weights' precision, a torch dtype or any `aogpt.precision` name (``bf16``...).
    """
    from aogpt.precision import to_dtype

    dtype = to_dtype(dtype)
    if weights not in ("ema", "raw"):
        raise AOGPTError(f"unknown weights {weights!r}", "use ema or raw")
    ckpt = find_checkpoint(Path(path))
    hf_config = read_json(ckpt / "config.json", what="checkpoint config")
    if isinstance(hf_config, dict) and hf_config.get("model_type") == HF_MODEL_TYPE:
        return _load_hf_folder(ckpt, hf_config, weights, device, dtype)
    cfg = read_config(ckpt)
    mcfg = model_config_from_dict(cfg["model"])
    tensors = read_weights(ckpt)
    if weights == "ema" and cfg.get("has_ema") is False:  # saved without EMA on purpose (`save`)
        weights = "raw"
    state = weights_of(tensors, weights)
    if not state:
        raise AOGPTError(f"{ckpt} holds no {weights} weights", "pass --weights raw" if weights == "ema" else "")
    if weights == "ema":  # buffers and any entry without an EMA copy come from the raw weights
        state = {**weights_of(tensors, "raw"), **state}
    model = _built(mcfg, state, f"{ckpt}/model.safetensors", device, dtype)
    return Loaded(model=model, tokenizer=_tokenizer(cfg.get("tokenizer"), ckpt / "tokenizer", mcfg), config=mcfg,
                  train_config=cfg.get("train", {}), step=int(cfg.get("step", 0)), path=ckpt, weights=weights,
                  meta=cfg)


def _built(mcfg: ModelConfig, state: dict[str, torch.Tensor], where: str, device: str | torch.device,
           dtype: torch.dtype) -> Transformer:
    model = Transformer.empty(mcfg)
    load_state_into(model, state, where=where)
    return model.to(device=device, dtype=dtype).eval()


def _tokenizer(spec: str | None, directory: Path, mcfg: ModelConfig | None = None) -> Any:
    """The checkpoint's tokenizer; for a fill-in-the-middle model, with its sentinels after its ids."""
    if not spec:
        return None
    from aogpt.data.tokenizer import load_tokenizer

    tok = load_tokenizer(spec, directory)
    if mcfg is not None and mcfg.fim_tokens:
        from aogpt.data.fim import Sentinels, with_sentinels

        tok = with_sentinels(tok)
        if tok.sentinels != Sentinels.from_list(mcfg.fim_tokens):
            raise AOGPTError(f"{directory.parent}: the sentinel ids {mcfg.fim_tokens} do not follow the tokenizer's "
                             f"{tok.text_vocab_size} ids", "use the tokenizer the model was trained with")
    return tok


def _load_hf_folder(folder: Path, cfg: dict[str, Any], weights: str, device: str | torch.device,
                    dtype: torch.dtype) -> Loaded:
    """A folder written by `aogpt export --format hf` (`aogpt.hf.export`), read without transformers:
    config.json holds our model config's fields, model.safetensors one set of weights under
    ``model.``, tokenizer.json (for bpe:N) sits beside them."""
    stored = cfg.get("weights") or "ema"
    if weights == "raw" and stored != "raw":
        raise AOGPTError(f"{folder} holds the {stored} weights only", "export the raw ones with --weights raw")
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    mcfg = model_config_from_dict({k: v for k, v in cfg.items() if k in names})
    state = weights_of(read_weights(folder), HF_WEIGHTS)
    model = _built(mcfg, state, f"{folder}/model.safetensors", device, dtype)
    return Loaded(model=model, tokenizer=_tokenizer(cfg.get("tokenizer"), folder, mcfg), config=mcfg,
                  step=int(cfg.get("training_step") or 0), path=folder, weights=stored, meta=cfg)
