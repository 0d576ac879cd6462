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
    p.add_argument("--pathway", choices=("shared", "gated"), default="shared",
                   help="shared (default): every slot through the same weights, all of them fine-tuned; gated: the "
                   "source's weights frozen and alone on the slots that read left to right, so read left to right "
                   "the model stays the source exactly, and a new pathway (linear deltas, adaLN, the target table) "
                   "trained for every other slot (docs/adapt.md)")
    p.add_argument("--rank", type=_rank, default=0, metavar="R|full",
                   help="with --pathway gated: the rank of each linear layer's delta, or full (default full)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --out")
    add_common(p)
    p.set_defaults(func=run)


def _rank(text: str) -> int:
    """A delta rank: a whole number >= 1, or ``full`` (0)."""
    if text.strip().lower() == "full":
        return 0
    return config_arg(ModelConfig, "pathway_rank")(text) or _refuse_zero()


def _refuse_zero() -> int:
    raise argparse.ArgumentTypeError("a rank must be at least 1 (or full)")


def run(args: argparse.Namespace) -> int:
    from aogpt.adaptation import adapt
    from aogpt.errors import AOGPTError

    if args.rank and args.pathway != "gated":
        raise AOGPTError("--rank is the rank of a gated pathway's deltas", "add --pathway gated, or drop --rank")
    loaded = adapt(args.source, args.variant, args.out, target_dim=args.target_dim,
                   block_size=args.block_size, seed=args.seed,
                   overwrite=args.overwrite, pathway=args.pathway, rank=args.rank)
    cfg = loaded.config
    params = loaded.model.num_params()
    trained = sum(p.numel() for p in loaded.model.parameters() if p.requires_grad)
    print(f"adapted {loaded.meta['adapted_from']['kind']} {args.source} -> {args.variant} at {args.out}: "
          f"{cfg.n_layer} layers, width {cfg.n_embd}, {params:,} parameters, tokenizer {loaded.tokenizer.spec}; "
          f"start slot: {loaded.meta['adapted_from']['start']}")
    if cfg.pathway == "gated":
        print(f"gated pathway: delta rank {cfg.pathway_rank or 'full'}, {trained:,} parameters trained, the source's "
              f"{params - trained:,} frozen: read left to right the model is the source, whatever fine-tuning does")
    print(f"fine-tuning recipe: {loaded.meta['recipe']} (carried by the checkpoint: train --init-from uses it "
          "unless --preset picks another)")
    print(f"next: aogpt train --init-from {args.out} --data DIR --out RUN --max-minutes M")
    if args.json:
        emit_json({"command": "adapt", "out": str(args.out), "variant": args.variant, "parameters": params,
                   "source": str(args.source), "kind": loaded.meta["adapted_from"]["kind"],
                    "start_slot": loaded.meta["adapted_from"]["start"], "recipe": loaded.meta["recipe"],
                    "pathway": cfg.pathway, "rank": cfg.pathway_rank if cfg.pathway == "gated" else None,
                    "trained_parameters": trained})
    return 0
