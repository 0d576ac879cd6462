"""`aogpt adapt`: a pretrained left-to-right decoder as an any-order model, equal to it at step 0
(docs/adapt.md)."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt.cli.common import add_common, config_arg, emit_json, path_arg
from aogpt.config import ModelConfig

HELP = ("turn a pretrained left-to-right decoder (transformers GPT-2, Llama, Qwen2, or a gpt run) into an "
        "any-order model")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "adapt", help=HELP,
        description=HELP + ". The source's backbone is kept switch for switch (norm, positions, MLP, attention heads, "
        "biases, head) and the variant's target pathway starts where it changes nothing, so read left to right the "
        "adapted model gives the source's logits; fine-tune it with `aogpt train --init-from DIR`. The source's "
        "tokenizer travels with the checkpoint.")
    p.add_argument("--from", dest="source", required=True, metavar="SRC",
                   help="a folder with a transformers causal LM (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM), "
                   "a hub name (needs a network), or an aogpt gpt run or checkpoint")
    p.add_argument("--variant", choices=("aogpt", "sigma"), default="aogpt",
                   help="aogpt (default): the target position drives adaLN in every block; sigma: it is added at "
                   "the input")
    p.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="checkpoint directory to write")
    p.add_argument("--target-dim", type=config_arg(ModelConfig, "target_dim"), default=128,
                   help="width of AO-GPT's target-position table (default 128)")
    p.add_argument("--block-size", type=config_arg(ModelConfig, "block_size"), default=None,
                   help="a shorter context than the source's (default: the source's, less the start slot)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --out")
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aogpt.adaptation import adapt

    loaded = adapt(args.source, args.variant, args.out, target_dim=args.target_dim,
                   block_size=args.block_size, seed=args.seed,
                   overwrite=args.overwrite)
    cfg = loaded.config
    params = loaded.model.num_params()
    print(f"adapted {loaded.meta['adapted_from']['kind']} {args.source} -> {args.variant} at {args.out}: "
          f"{cfg.n_layer} layers, width {cfg.n_embd}, {params:,} parameters, tokenizer {loaded.tokenizer.spec}; "
          f"start slot: {loaded.meta['adapted_from']['start']}")
    print(f"fine-tuning recipe: {loaded.meta['recipe']} (carried by the checkpoint: train --init-from uses it "
          "unless --preset picks another)")
    print(f"next: aogpt train --init-from {args.out} --data DIR --out RUN --max-minutes M")
    if args.json:
        emit_json({"command": "adapt", "out": str(args.out), "variant": args.variant, "parameters": params,
                   "source": str(args.source), "kind": loaded.meta["adapted_from"]["kind"],
                    "start_slot": loaded.meta["adapted_from"]["start"], "recipe": loaded.meta["recipe"]})
    return 0
