"""`aogpt prepare`: tokenize a corpus into memory-mapped train/val token files (sharded when large)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aogpt.cli.common import add_common, emit_json, finite_float, int_arg, path_arg, positive_int

DESCRIPTION = """\
Tokenize a corpus into DIR/train.bin and DIR/val.bin (flat token ids, uint16 or uint32), DIR/meta.json
and, for bpe:N, the trained DIR/tokenizer.json. Every document is followed by one EOT token. A split
larger than --shard-tokens is written as shards DIR/train-00000.bin, DIR/train-00001.bin, ... The
directory is built in DIR/../.DIR.partial and renamed at the end, so a failed run keeps an older good
one. An interrupted run that finished a shard is resumed by re-running the same command.

corpora:  shakespeare (default; 38 plays, Hamlet/The Tempest/Julius Caesar held out)
          wiki-excerpt (106 Wikipedia articles from gensim's test data)
          PATH: a .txt file (one document; see --txt-docs), a .jsonl file (one document per line,
          see --text-field) or a directory of them (recursive, sorted); UTF-8 only
          hf:NAME[:CONFIG], openwebtext, wikitext-103-raw-v1, wikitext-2-raw-v1 (streamed; need
          `datasets` and network access); openwebtext holds out its last 100,000 documents
          synthetic:walk, synthetic:sudoku4, synthetic:sudoku6 (solutions of puzzles generated from
          --seed, one document each: 20,000 for training, 1,000 (--val-docs) for validation;
          tokenizer bytes)
tokenizers: bpe:N (byte-level BPE with N ids trained on the train split), gpt2, bytes
"""


MAX_WORKERS = 1024


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into memory-mapped token files",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--corpus", default="shakespeare", metavar="NAME|PATH", help="what to tokenize (default shakespeare)"
    )
    p.add_argument("--tokenizer", default=None, metavar="SPEC",
                   help="gpt2, bytes or bpe:N (default bpe:4096; bytes for synthetic corpora), or a checkpoint "
                   "directory whose tokenizer to use (e.g. one written by aogpt adapt)")
    p.add_argument("--out", type=path_arg, default=None, metavar="DIR",
                   help="output directory (default data/<corpus>-<tokenizer>)")
    p.add_argument(
        "--val-fraction",
        type=finite_float(gt=0, lt=1),
        default=None,
        metavar="F",
        help="fraction of documents held out, for corpora without a validation split (default 0.05)",
    )
    p.add_argument(
        "--val-docs",
        type=positive_int,
        default=None,
        metavar="N",
        help="hold out the last N documents instead (default for openwebtext: 100000)",
    )
    p.add_argument(
        "--max-docs",
        type=positive_int,
        default=None,
        metavar="N",
        help="read at most N documents (per defined split, else before splitting)",
    )
    p.add_argument("--text-field", default="text", metavar="NAME", help="text field of .jsonl / HF rows (default text)")
    p.add_argument(
        "--txt-docs",
        choices=("file", "blank-lines"),
        default="file",
        help="text files: one document per file (default) or per blank-line-separated block",
    )
    p.add_argument(
        "--workers",
        type=int_arg(ge=1, le=MAX_WORKERS),
        default=None,
        metavar="N",
        help="tokenizer processes (default: in-process for small local corpora, else one per CPU)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int_arg(ge=1, le=2**40),
        default=None,
        metavar="N",
        help="tokens per shard file (default 100000000); smaller splits stay one file",
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume", action="store_true", help="insist on resuming an interrupted run (the default when one exists)"
    )
    again.add_argument("--restart", action="store_true", help="discard an interrupted run and start afresh")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aogpt.data import DEFAULT_SHARD_TOKENS, default_out_dir, prepare
    from aogpt.data.synthetic import PREFIX as SYNTHETIC
    from aogpt.data.tokenizer import DEFAULT_TOKENIZER, normalize_spec

    default = "bytes" if args.corpus.startswith(SYNTHETIC) else DEFAULT_TOKENIZER  # one token per cell
    given = args.tokenizer or default
    from_checkpoint = Path(given).expanduser().is_dir()
    spec = given if from_checkpoint else normalize_spec(given)
    out = args.out or default_out_dir(args.corpus, Path(given).name if from_checkpoint else spec)
    meta = prepare(
        args.corpus,
        spec,
        out,
        val_fraction=args.val_fraction,
        val_docs=args.val_docs,
        seed=args.seed,
        progress=not args.no_progress,
        max_docs=args.max_docs,
        workers=args.workers,
        shard_tokens=DEFAULT_SHARD_TOKENS if args.shard_tokens is None else args.shard_tokens,
        resume="require" if args.resume else "restart" if args.restart else "auto",
        text_field=args.text_field,
        txt_docs=args.txt_docs,
    )
    splits = meta["splits"]
    shards = {name: len(info.get("shards", [info])) for name, info in splits.items()}
    print(f"wrote {out} in {meta['seconds']:.1f} s: {meta['tokenizer']} (vocab {meta['vocab_size']}, {meta['dtype']})")
    if meta["resumed_documents"]:
        print(f"  resumed an interrupted run after {meta['resumed_documents']:,} documents")
    for name, info in splits.items():
        more = f" in {shards[name]} shards" if shards[name] > 1 else ""
        per_token = info["bytes"] / max(info["tokens"], 1)
        print(f"  {name:5s} {info['tokens']:>12,} tokens  {info['documents']:>9,} documents  "
              f"{info['bytes']:>14,} bytes ({per_token:.2f} per token){more}")
    if args.json:
        emit_json(
            {
                "command": "prepare",
                "out": str(out),
                "corpus": meta["corpus"],
                "tokenizer": meta["tokenizer"],
                "vocab_size": meta["vocab_size"],
                "padded_vocab_size": meta["padded_vocab_size"],
                "dtype": meta["dtype"],
                "train_tokens": splits["train"]["tokens"],
                "val_tokens": splits["val"]["tokens"],
                "train_documents": splits["train"]["documents"],
                "val_documents": splits["val"]["documents"],
                "train_bytes": splits["train"]["bytes"],
                "val_bytes": splits["val"]["bytes"],
                "train_shards": shards["train"],
                "val_shards": shards["val"],
                "resumed_documents": meta["resumed_documents"],
                "seconds": round(meta["seconds"], 3),
            }
        )
    return 0
