"""The `aogpt` command line: one parser, one subcommand module per command.

Each module in `COMMANDS` defines ``add_parser(subparsers)`` (registering its subparser with
``set_defaults(func=run)``) and ``run(args) -> int``. User errors (`AOGPTError`), and ``aogpt`` with
no command, become a one-line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from aogpt.allocator import keep_freed_memory
from aogpt.errors import AOGPTError

COMMANDS = ["prepare", "train", "adapt", "sample", "eval", "bench", "convert", "harness", "compare", "reproduce",
            "serve"]
# Long-lived commands whose memory must follow their load: they keep glibc's default thresholds, so memory a
# burst of requests used goes back to the system (the server also trims every few seconds, aogpt.serve).
MEMORY_FOLLOWS_LOAD = {"serve"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: same one-line form, exit 2
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aogpt", description="Any-order GPT: train, evaluate, sample and benchmark.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"aogpt.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in MEMORY_FOLLOWS_LOAD:
        keep_freed_memory()  # steps that free and re-allocate the same tensors reuse them (aogpt.allocator)
    try:
        if not getattr(args, "func", None):  # plain `aogpt`: said like any other bad input
            raise AOGPTError("no command given", f"run {parser.prog} --help")
        return int(args.func(args) or 0)
    except AOGPTError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (`aogpt ... | head`, a killed script)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
