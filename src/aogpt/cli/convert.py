"""`aogpt import` and `aogpt export`: the paper's released checkpoints in and out (docs/checkpoints.md), and
Hugging Face folders out (docs/ecosystem.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tqdm.auto import tqdm

from aogpt.cli.common import add_common, emit_json, path_arg, progress
from aogpt.errors import AOGPTError


def add_parser(subparsers: Any) -> None:
    imp = subparsers.add_parser(
        "import",
        help="convert a released AO-GPT / sigma-GPT .pt checkpoint into an aogpt checkpoint",
        description="Convert the paper's reference checkpoint (nanoGPT-style .pt, AO-GPT or sigma-GPT, "
        "detected from its keys) into an aogpt checkpoint directory that `aogpt.load`, "
        "`aogpt eval` and `aogpt sample` read. The file is read with weights_only=True and "
        "every key and shape is checked.",
    )
    imp.add_argument("file", metavar="FILE.pt", help="the reference checkpoint")
    imp.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="checkpoint directory to write")
    imp.add_argument(
        "--weights",
        choices=("ema", "raw"),
        default="ema",
        help="ema (default): store raw and EMA weights, loads use the EMA; "
        "raw: store the raw weights only (for files without an EMA)",
    )
    imp.add_argument(
        "--tokenizer",
        default="auto",
        metavar="SPEC",
        help="tokenizer to record: auto (default: gpt2 when the vocabulary is GPT-2's "
        "50257/50304, else none), none, gpt2, bytes or bpe:N (with --tokenizer-dir)",
    )
    imp.add_argument(
        "--tokenizer-dir", default=None, metavar="DIR", help="directory holding a bpe:N tokenizer's tokenizer.json"
    )
    imp.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --out")
    add_common(imp)
    imp.set_defaults(func=run_import)

    exp = subparsers.add_parser(
        "export",
        help="write a checkpoint in the paper's reference .pt format or as a Hugging Face folder",
        description="Write one of our checkpoints (a ckpt-* directory, or a run's newest) as a "
        "nanoGPT-style .pt file in the paper's reference format (only the aogpt and sigma "
        "variants with the paper's architecture), or with --format hf as a folder that "
        "transformers' AutoModelForCausalLM and AutoTokenizer load (gpt, sigma and aogpt).",
    )
    exp.add_argument("run", metavar="RUN", help="a run directory or a ckpt-* directory")
    exp.add_argument(
        "--format",
        choices=("reference", "hf"),
        default="reference",
        help="reference (default): the paper's release format; hf: a Hugging Face folder "
        "(config, safetensors weights, tokenizer, modeling code)",
    )
    exp.add_argument("--out", type=path_arg, required=True, metavar="FILE.pt|DIR",
                     help="file (reference) or folder (hf) to write")
    exp.add_argument(
        "--weights",
        choices=("both", "raw", "ema"),
        default=None,
        help="reference: both (default): raw as `model`, EMA as `ema_model`; raw: `model` only; "
        "ema: the EMA weights as `model`, no `ema_model`. hf: ema (default) or raw",
    )
    exp.add_argument("--overwrite", action="store_true", help="replace an existing file or folder at --out")
    add_common(exp)
    exp.set_defaults(func=run_export)


def _warn(msg: str) -> None:
    tqdm.write(f"warning: {msg}", file=sys.stderr)  # above the progress bar, not through it


def run_import(args: argparse.Namespace) -> int:
    from aogpt.reference import import_reference

    with progress(total=4, desc="import") as bar:

        def stage(name: str) -> None:  # read, hash, build, write
            bar.set_description(f"import: {name}")
            bar.update(0 if name == "read" else 1)

        summary = import_reference(
            args.file, args.out, weights=args.weights, tokenizer=args.tokenizer, tokenizer_dir=args.tokenizer_dir,
            overwrite=args.overwrite, warn=_warn, stage=stage,
        )  # fmt: skip
        bar.update(1)
    weights = "raw and EMA" if summary["ema_stored"] else "raw"
    print(
        f"imported {summary['architecture']} ({summary['params']:,} parameters, step {summary['step']}, "
        f"{weights} weights, tokenizer {summary['tokenizer'] or 'none'}) into {summary['out']}"
    )
    if args.json:
        emit_json({"command": "import", **summary})
    return 0


def run_export(args: argparse.Namespace) -> int:
    if args.format == "hf":
        return _export_hf(args)
    from aogpt.reference import export_reference

    args.weights = args.weights or "both"
    with progress(total=1, desc="export") as bar:
        summary = export_reference(args.run, args.out, weights=args.weights, overwrite=args.overwrite)
        bar.update()
    print(
        f"exported {summary['architecture']} from {summary['checkpoint']} ({summary['weights']} weights, "
        f"step {summary['step']}) to {summary['out']}"
    )
    if args.json:
        emit_json({"command": "export", "format": args.format, **summary})
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    if args.weights == "both":
        raise AOGPTError("a Hugging Face folder holds one set of weights", "pass --weights ema or --weights raw")
    from aogpt.hf import export_hf

    with progress(total=1, desc="export") as bar:
        summary = export_hf(args.run, args.out, weights=args.weights or "ema", overwrite=args.overwrite)
        bar.update()
    print(
        f"exported {summary['variant']} from {summary['checkpoint']} ({summary['weights']} weights, step "
        f"{summary['step']}, tokenizer {summary['tokenizer'] or 'none'}) as a Hugging Face folder: {summary['out']}"
    )
    if args.json:
        emit_json({"command": "export", "format": "hf", **summary})
    return 0
