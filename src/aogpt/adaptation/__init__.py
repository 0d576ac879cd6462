"""Turn a pretrained left-to-right decoder into an any-order model that equals it at step 0.

`adapt(source, variant)` reads a source (a `transformers` causal LM folder or hub name of a
supported family, or one of our own left-to-right `gpt` runs), rebuilds its backbone switch for
switch on `aogpt.model.Transformer` (norm, positions, MLP, attention heads, biases, head), adds the
variant's target pathway in a state that changes nothing (`aogpt.adaptation.target`), and returns
the model with the source's tokenizer; with `out` it also writes a normal aogpt checkpoint that
`train --init-from`, `sample`, `eval`, `export` and `harness` use like any other (docs/adapt.md).

Why it can be exact: AO-GPT stays a causal decoder, so read left to right the adapted model *is*
the source model (the start slot holding the source's beginning-of-text token) until fine-tuning
teaches the target pathway to use other orders; generation keeps the exact KV cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aogpt.adaptation.registry import read_source
from aogpt.adaptation.source import Source
from aogpt.adaptation.target import build
from aogpt.pathway import PATHWAYS

VARIANTS = ("aogpt", "sigma")
RECIPE = "adapt"  # the preset an adapted checkpoint carries for its fine-tuning (docs/adapt.md)
RECIPES = {"shared": RECIPE, "gated": "adapt-gated"}  # by pathway (`aogpt.pathway`)


def adapt(source: str | Path, variant: str = "aogpt", out: str | Path | None = None, *, target_dim: int = 128,
          block_size: int | None = None, seed: int = 0, overwrite: bool = False, pathway: str = "shared",
          rank: int = 0) -> Any:
    """The any-order model made from `source` (`aogpt.checkpoint.Loaded`: model, tokenizer, config).

    source: a folder holding a `transformers` causal LM (GPT-2, Llama, Qwen2 and models of their
    shape), a hub name (downloaded by `transformers` where there is a network), or an aogpt `gpt`
    run or checkpoint. variant: ``aogpt`` (adaLN in every block) or ``sigma`` (the target position
    added at the input). target_dim: the width of AO-GPT's target-position table. out: a checkpoint
    directory to write (refused if it exists unless `overwrite`). seed: draws the target table (the
    rest is the source's or zero). block_size: a shorter context than the source's (its position
    and target tables cut to it), for fine-tuning on shorter windows. pathway: ``shared`` (every slot
    through the same weights, all of them trained) or ``gated`` (`aogpt.pathway`: the source frozen and
    alone on the slots that read left to right, a new pathway whose linear deltas have rank `rank`, 0
    for full rank, on every other slot).
    """
    from aogpt.checkpoint import Loaded, save
    from aogpt.errors import AOGPTError, check_choice

    check_choice("variant", variant, VARIANTS)
    check_choice("pathway", pathway, PATHWAYS)
    if rank < 0:
        raise AOGPTError(f"the pathway's rank must be at least 1 (or full), got {rank}", "pass --rank R or full")
    if rank and pathway != "gated":
        raise AOGPTError("a delta rank is a gated pathway's", "add --pathway gated, or drop --rank")
    if out is not None and Path(out).exists() and not overwrite:
        raise AOGPTError(f"{out} already exists", "choose a new --out, or pass --overwrite")
    src = read_source(source)
    if block_size is not None:
        have = src.backbone["block_size"]
        if not 1 <= block_size <= have:
            raise AOGPTError(f"block size {block_size} is not within the source's context of {have} tokens "
                             "(after the start slot)", f"pass --block-size between 1 and {have}")
        src.backbone["block_size"] = block_size
        if "transformer.wpe.weight" in src.state:
            src.state["transformer.wpe.weight"] = src.state["transformer.wpe.weight"][:block_size + 1].clone()
    model = build(src, variant, target_dim=target_dim, seed=seed, pathway=pathway, rank=rank)
    # the fine-tuning recipe `train --init-from` uses when no preset is given (aogpt.config.ADAPT_RECIPE, or
    # GATED_RECIPE for a gated pathway)
    extra = {"adapted_from": {"source": str(source), "kind": src.kind, "start": src.start_note},
             "recipe": RECIPES[pathway]}
    if out is not None:
        from aogpt.io import directory_lock

        with directory_lock(Path(out), "aogpt adapt"):
            save(model, out, tokenizer=src.tokenizer, extra=extra)
    model.eval()
    return Loaded(model=model, tokenizer=src.tokenizer, config=model.config, path=None if out is None else Path(out),
                  weights="raw", meta=extra)


__all__ = ["RECIPE", "RECIPES", "VARIANTS", "Source", "adapt", "build", "read_source"]
