"""`aogpt import` / `aogpt export`: the paper's ``.pt`` checkpoints to our checkpoint directories and
back (``import(export(x)) == x`` tensor for tensor); the format itself is `aogpt.reference.format`.
"""

from __future__ import annotations

import hashlib
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aogpt.checkpoint import FORMAT, find_checkpoint, read_config, read_weights, save_checkpoint, weights_of
from aogpt.config import model_config_from_dict, to_dict
from aogpt.errors import AOGPTError
from aogpt.io import atomic_write_bytes, directory_lock, ensure_writable_dir
from aogpt.reference.format import (
    ARCH_NAMES,
    GPT2_VOCABS,
    MODEL_ARGS,
    PAPER_EMA_DECAY,
    Stage,
    build_model,
    check_weights,
    meta_model,
    parameter_names,
    plain_value,
    read_reference,
    reference_incompatibilities,
)


# ---------------------------------------------------------------------------------------------- import
def _tokenizer_for(spec: str, vocab: int, directory: Path | None, warn: Callable[[str], None]) -> Any:
    """The tokenizer to store with an import (None: none recorded). "auto": gpt2 for GPT-2 vocabs."""
    if spec == "none":
        return None
    if spec == "auto":
        if vocab not in GPT2_VOCABS:
            warn(
                f"the model's vocabulary ({vocab}) is not GPT-2's, so no tokenizer is recorded; "
                "pass --tokenizer SPEC to record one (without it, text cannot be encoded or decoded)"
            )
            return None
        spec = "gpt2"
    from aogpt.data.tokenizer import load_tokenizer

    tok = load_tokenizer(spec, directory)
    if tok.vocab_size > vocab:
        raise AOGPTError(
            f"tokenizer {spec} has {tok.vocab_size} ids but the model only {vocab}",
            "pass the tokenizer the model was trained with, or --tokenizer none",
        )
    return tok


def _check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse to replace anything but an existing aogpt checkpoint (or an empty directory)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise AOGPTError(f"{out} already exists", "choose another --out or pass --overwrite")
    if not (out / "config.json").is_file() or not (out / "model.safetensors").is_file():
        raise AOGPTError(
            f"{out} exists and is not an aogpt checkpoint (--overwrite only replaces checkpoints)",
            "choose another --out",
        )


def import_reference(
    path: str | Path,
    out: str | Path,
    weights: str = "ema",
    tokenizer: str = "auto",
    tokenizer_dir: str | Path | None = None,
    overwrite: bool = False,
    warn: Callable[[str], None] | None = None,
    stage: Stage | None = None,
) -> dict[str, Any]:
    """Convert a reference checkpoint into our checkpoint directory `out`; returns a summary.

    weights="ema": raw and EMA weights are both stored (`aogpt.load` uses the EMA, ``weights="raw"``
    the raw ones); "raw": only the raw weights are stored (the file may lack an EMA). `stage` is
    told when each step (read, hash, build, write) starts, for a progress display.
    """
    check_weights(weights, ("ema", "raw"))
    path, out, stage = Path(path), Path(out), stage or (lambda name: None)
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    with directory_lock(out, "aogpt import"):  # one writer per output
        _check_out_dir(out, overwrite)
        return _import(path, out, weights, tokenizer, tokenizer_dir, warn, stage)


def _import(path: Path, out: Path, weights: str, tokenizer: str, tokenizer_dir: str | Path | None,
            warn: Callable[[str], None], stage: Stage) -> dict[str, Any]:
    stage("read")
    ref = read_reference(path, need_ema=weights == "ema")
    tok = _tokenizer_for(tokenizer, ref.config.vocab_size, Path(tokenizer_dir) if tokenizer_dir else None, warn)
    stage("hash")
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    stage("build")
    model = build_model(ref, "raw")
    arch = ARCH_NAMES[ref.variant]
    source = dict(
        format="reference",
        file=str(path.resolve()),
        sha256=digest,
        architecture=arch,
        weights=weights,
        ema_decay=ref.ema_decay,
        ema_num_updates=ref.ema_num_updates,
        model_args=ref.model_args,
        ignored_keys=ref.ignored_keys,
        config=ref.extra_config,
    )
    spec = tok.spec if tok is not None else None
    config = {"model": to_dict(ref.config), "tokenizer": spec, "step": ref.iter_num, "source": source}
    stage("write")
    ema = {k: v.float() for k, v in ref.ema.items()} if weights == "ema" else None  # float32, as the raw weights
    save_checkpoint(out, model, config=config, ema=ema, tokenizer=tok)
    return dict(
        out=str(out),
        variant=ref.variant,
        architecture=arch,
        params=model.num_params(),
        weights=weights,
        ema_stored=weights == "ema",
        step=ref.iter_num,
        tokenizer=spec,
        sha256=digest,
        ignored_keys=ref.ignored_keys,
    )


# ---------------------------------------------------------------------------------------------- export
def export_reference(
    run: str | Path, out: str | Path, weights: str = "both", overwrite: bool = False
) -> dict[str, Any]:
    """Write our checkpoint (a ckpt-* directory or a run's newest) as a reference ``.pt`` file.

    weights="both": ``model`` = raw weights and ``ema_model`` = the EMA (needs one); "raw": ``model``
    only; "ema": the EMA weights as ``model`` (for tools that read nothing else), no ``ema_model``.
    """
    check_weights(weights, ("both", "raw", "ema"))
    out = Path(out)
    with directory_lock(out, "aogpt export"):  # one writer per output file
        return _export(run, out, weights, overwrite)


def _export(run: str | Path, out: Path, weights: str, overwrite: bool) -> dict[str, Any]:
    if out.is_dir() or (out.exists() and not overwrite):
        raise AOGPTError(f"{out} already exists", "choose another --out" + ("" if out.is_dir() else " or --overwrite"))
    ckpt = find_checkpoint(Path(run))
    meta = read_config(ckpt)
    cfg = model_config_from_dict(meta["model"])
    if why := reference_incompatibilities(cfg):
        raise AOGPTError(
            f"{ckpt} is not a reference architecture: {'; '.join(why)}",
            "only aogpt and sigma models with the paper's architecture can be exported",
        )
    tensors = read_weights(ckpt)
    raw, ema = weights_of(tensors, "raw"), weights_of(tensors, "ema")
    names = parameter_names(cfg)
    if weights != "raw" and (lost := [n for n in names if n not in ema]):
        what = "no EMA weights" if not ema else f"EMA weights without {', '.join(lost[:5])}"
        raise AOGPTError(f"{ckpt} holds {what}", "pass --weights raw")
    chosen = {**raw, **ema} if weights == "ema" else raw
    state = {}
    for key in meta_model(cfg).state_dict():  # the reference lists the tied head too (sharing wte's storage)
        if key == "lm_head.weight" and cfg.tie_head:
            state[key] = state["transformer.wte.weight"]
        elif key in chosen:
            state[key] = chosen[key]
        else:
            raise AOGPTError(f"{ckpt}: its weights lack {key}", "the checkpoint is corrupted")
    train, src, step = meta.get("train") or {}, meta.get("source") or {}, int(meta.get("step", 0))
    # `config` (the training script's globals, informational): the original file's after an import, else ours.
    own = plain_value({**train, "model": meta["model"]})
    extra = dict(src["config"]) if isinstance(src.get("config"), dict) else own
    extra["exported_by"] = f"aogpt ({FORMAT})"
    args = {k: getattr(cfg, k) for k in MODEL_ARGS}
    args["dropout"] = (src.get("model_args") or {}).get("dropout", cfg.dropout)  # the training dropout, if known
    obj: dict[str, Any] = {
        "model": state,
        "model_args": args,
        "iter_num": step,
        "config": extra,
    }
    if weights == "both":
        decay = float(src.get("ema_decay") or train.get("ema_decay") or PAPER_EMA_DECAY)
        updates = src.get("ema_num_updates")
        shadow = [ema[n] for n in names]
        obj["ema_model"] = {
            "decay": decay,
            "num_updates": step if updates is None else updates,
            "shadow_params": shadow,
        }
        obj["ema_rate"] = decay
    buf = io.BytesIO()
    torch.save(obj, buf)
    ensure_writable_dir(out.parent)
    atomic_write_bytes(out, buf.getvalue())  # with the mode the umask allows
    return dict(
        out=str(out),
        checkpoint=str(ckpt),
        variant=cfg.variant,
        architecture=ARCH_NAMES[cfg.variant],
        weights=weights,
        keys=len(state),
        shadow_params=len(names) if weights == "both" else 0,
        step=step,
        bytes=buf.tell(),
    )
