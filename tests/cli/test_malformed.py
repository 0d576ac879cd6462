"""A corpus of malformed invocations of every command: each must exit with status 2, print exactly
one line on stderr (``error: ...`` containing the expected words), no traceback, and change no file
that existed before (every file's size, mtime and mode are compared).

The memory checks compare their estimates with 4 GiB of available memory (a stand-in for
/proc/meminfo), so the cases that must be refused for memory are refused on any machine.

Placeholders: {data} a prepared directory, {run} a trained run, {ckpt} its newest checkpoint, {s} a
sandbox of damaged files (built once), {t} a fresh directory per case. Each case runs in-process
and is refused before any heavy work, so the whole table takes seconds.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from aogpt.checkpoint import list_checkpoints

T = ["train", "--preset", "tiny", "--data", "{data}", "--out", "{t}/r", "--no-progress"]
S = ["sample", "--checkpoint", "{run}", "--no-progress"]
E = ["eval", "--checkpoint", "{run}", "--data", "{data}"]
P = ["prepare", "--corpus", "{s}/corpus", "--tokenizer", "bytes", "--out", "{t}/p", "--no-progress"]
R = ["train", "--out", "{run}", "--resume"]  # resuming the trained run
BG = ["bench", "generate", "--quick", "--out", "{t}/b", "--no-progress"]
BD = ["bench", "density", "--quick", "--out", "{t}/b", "--no-progress"]
BT = ["bench", "train", "--quick", "--out", "{t}/b", "--no-progress"]
BE = ["bench", "eval", "--quick", "--out", "{t}/b", "--no-progress"]
BP = ["bench", "prepare", "--quick", "--out", "{t}/b", "--no-progress"]

CASES: list[tuple[list[str], str]] = [
    # --- the parser and every command's common flags
    ([], "error: no command given (run aogpt --help)"),
    (["nonsense"], "invalid choice"),
    (["train", "--lr"], "expected one argument"),
    (["train", "--out", "{t}/r", "--bogus"], "unrecognized arguments"),
    ([*S, "--seed", "-1"], "argument --seed: must be in [0, 2^62], got -1"),
    ([*S, "--seed", "1e3"], "argument --seed: must be an integer, got '1e3'"),
    ([*S, "--seed", "99999999999999999999999"], "argument --seed: must be in [0, 2^62]"),
    ([*P, "--seed", "nan"], "argument --seed: must be an integer"),
    # --- train: every number in range and finite
    ([*T, "--lr", "nan"], "argument --lr: must be a finite number in (0, 1], got nan"),
    ([*T, "--lr", "inf"], "argument --lr: must be a finite number"),
    ([*T, "--lr", "-1"], "argument --lr: must be in (0, 1], got -1.0"),
    ([*T, "--lr", "0"], "argument --lr: must be in (0, 1]"),
    ([*T, "--lr", "1e9"], "argument --lr: must be in (0, 1]"),
    ([*T, "--lr", "fast"], "argument --lr: must be a number, got 'fast'"),
    ([*T, "--ema-decay", "nan"], "argument --ema-decay: must be a finite number"),
    ([*T, "--ema-decay", "1"], "argument --ema-decay: must be in [0, 1)"),
    ([*T, "--ema-decay", "1.5"], "argument --ema-decay: must be in [0, 1)"),
    ([*T, "--ema-decay", "-0.1"], "argument --ema-decay"),
    ([*T, "--batch-size", "0"], "argument --batch-size: must be in [1, "),
    ([*T, "--batch-size", "-3"], "argument --batch-size"),
    ([*T, "--batch-size", "4.5"], "argument --batch-size: must be an integer"),
    ([*T, "--batch-size", "1000000"], "training needs about"),
    ([*T, "--grad-accum", "0"], "argument --grad-accum"),
    ([*T, "--grad-accum", "-2"], "argument --grad-accum"),
    ([*T, "--global-batch-tokens", "-1"], "argument --global-batch-tokens"),
    ([*T, "--global-batch-tokens", "7"], "not divisible"),
    ([*T, "--global-batch-tokens", str(2**40)], "the accumulation steps derived from a global batch"),
    ([*T, "--ckpt-interval", "0"], "argument --ckpt-interval"),
    ([*T, "--ckpt-interval", "-1"], "argument --ckpt-interval"),
    ([*T, "--eval-interval", "0"], "argument --eval-interval"),
    ([*T, "--keep-last", "-1"], "argument --keep-last: must be in [0, "),
    ([*T, "--max-steps", "-1"], "argument --max-steps: must be in [1, 1_000_000_000], got -1"),
    ([*T, "--max-steps", "0"], "argument --max-steps"),
    ([*T, "--max-steps", "1000000000000"], "argument --max-steps"),
    ([*T, "--max-minutes", "nan"], "argument --max-minutes: must be a finite number"),
    ([*T, "--max-minutes", "-1"], "argument --max-minutes"),
    ([*T, "--max-minutes", "inf"], "argument --max-minutes"),
    ([*T, "--dry-run", "--assume-tflops", "0"], "argument --assume-tflops: must be in (0, "),
    ([*T, "--dry-run", "--assume-tflops", "nan"], "argument --assume-tflops"),
    ([*T, "--dry-run", "--assume-tflops", "-5"], "argument --assume-tflops"),
    ([*T, "--block-size", "0"], "argument --block-size"),
    ([*T, "--block-size", "-1"], "argument --block-size"),
    ([*T, "--block-size", "1e3"], "argument --block-size: must be an integer"),
    ([*T, "--block-size", "100000"], "fewer than one block"),
    ([*T, "--seed", "-5"], "argument --seed"),
    ([*T, "--set", "model.dropout=1.5"], "model config: dropout must be in [0, 1), got 1.5"),
    ([*T, "--set", "model.dropout=-0.1"], "model config: dropout"),
    ([*T, "--set", "model.dropout=NaN"], "model config: dropout must be a finite number"),
    ([*T, "--set", "model.n_embd=65536", "--set", "model.n_head=1"], "training needs about"),
    ([*T, "--set", "model.n_layer=0"], "model config: n_layer must be in [1, 1024], got 0"),
    ([*T, "--set", "model.n_layer=100000"], "model config: n_layer"),
    ([*T, "--set", "model.norm_eps=0"], "model config: norm_eps"),
    ([*T, "--set", "model.target_dim=0"], "model config: target_dim"),
    ([*T, "--set", "model.vocab_size=0"], "model config: vocab_size"),
    ([*T, "--set", "model.n_layer=2.5"], "model config: n_layer must be int"),
    ([*T, "--set", "model.bias=1"], "model config: bias must be bool"),
    ([*T, "--set", "train.warmup_steps=-1"], "train config: warmup_steps"),
    ([*T, "--set", "train.min_lr=0.5"], "min_lr 0.5 is above lr"),
    ([*T, "--set", "train.weight_decay=NaN"], "train config: weight_decay must be a finite number"),
    ([*T, "--set", "train.beta1=1.0"], "train config: beta1 must be in [0, 1)"),
    ([*T, "--set", "train.beta2=-0.5"], "train config: beta2"),
    ([*T, "--set", "train.grad_clip=-1"], "train config: grad_clip"),
    ([*T, "--set", "train.eval_batches=0"], "train config: eval_batches"),
    ([*T, "--set", "train.log_interval=0"], "train config: log_interval"),
    ([*T, "--set", "train.seed=-1"], "train config: seed"),
    ([*T, "--set", "train.extra=5"], "train config: extra must be dict"),
    ([*T, "--set", "train.schedule_steps=-2"], "train config: schedule_steps"),
    ([*T, "--set", "model.n_layers=3"], "unknown key 'n_layers'"),
    ([*T, "--set", "nonsense"], "is not KEY=VALUE"),
    ([*T, "--set", "optim.lr=1"], "unknown section 'optim'"),
    ([*T, "--set", "model.variant=bert"], "unknown variant"),
    ([*T, "--device", "gpu9"], "unknown device 'gpu9'"),
    ([*T, "--device", "cuda"], "CUDA is not available"),
    ([*T, "--dtype", "int8"], "unknown precision 'int8'"),
    ([*T, "--order", "mixture:2"], "the probability must be in [0, 1], got 2.0"),
    ([*T, "--order", "mixture:nan"], "the probability must be a finite number"),
    ([*T, "--order", "blockwise:0"], "the block size must be in [2, "),
    ([*T, "--order", "blockwise:100000000"], "the block size must be in [2, "),
    ([*T, "--order", "fixed-random:-1"], "the seed must be in [0, 2^62]"),
    ([*T, "--order", "sideways"], "unknown order spec 'sideways'"),
    ([*T, "--preset", "huge"], "unknown preset 'huge'"),
    ([*T, "--variant", "bert"], "unknown variant"),
    ([*T, "--fsdp"], "--fsdp shards the model over several processes"),
    ([*T, "--extend-to", "9"], "--extend-to continues a run"),
    ([*T, "--config", "{s}/bad-type.json"], "train config: lr must be float, got 'x'"),
    ([*T, "--config", "{s}/nan.toml"], "model config: dropout must be a finite number"),
    ([*T, "--config", "{s}/list.json"], "must hold a table/object"),
    ([*T, "--config", "{s}/preset-number.json"], "preset must be a string"),
    ([*T, "--config", "{s}/nope.json"], "not found"),
    ([*T, "--init-from", "{s}/nothing-here"], "does not exist"),
    (["train", "--preset", "tiny", "--data", "{s}/meta-missing", "--out", "{t}/r"], "lacks the key 'dtype'"),
    (["train", "--preset", "tiny", "--data", "{s}/meta-type", "--out", "{t}/r"], "vocab_size must be int, got '257'"),
    (["train", "--preset", "tiny", "--data", "{s}/meta-escape", "--out", "{t}/r"],
     "is not a file name inside the directory"),
    (["train", "--preset", "tiny", "--data", "{s}/meta-splits", "--out", "{t}/r"], "splits must be dict"),
    (["train", "--preset", "tiny", "--data", "{s}/meta-list", "--out", "{t}/r"], "has data format None"),
    (["train", "--preset", "tiny", "--data", "{s}/bad-ids", "--out", "{t}/r"],
     "holds token id 60000, outside the vocabulary of 320"),
    (["train", "--preset", "tiny", "--data", "{s}/nothing-here", "--out", "{t}/r"], "does not exist"),
    (["train", "--preset", "tiny", "--out", "{t}/r"], "no training data given"),
    (["train", "--preset", "tiny", "--data", "{data}", "--out", "/proc/aogpt-nowhere/r"], "cannot create directory"),
    (["train", "--preset", "tiny", "--data", "{data}", "--out", "{s}/a-file/r"], "cannot create directory"),
    (["train", "--preset", "tiny", "--data", "{data}", "--out", "{run}"], "already holds checkpoints"),
    # --- resuming: only what does not change the run may change
    ([*R, "--preset", "gpt2-small"], "cannot change the preset when resuming"),
    ([*R, "--max-steps", "100"], "cannot change max_steps when resuming"),
    ([*R, "--extend-to", "2"], "--extend-to 2 is not past the checkpoint's step 6"),
    (R, "is the end of its run (step 6 of 6)"),
    ([*R, "--lr", "0.5"], "cannot change lr"),
    ([*R, "--set", "model.n_layer=3"], "cannot change the model"),
    ([*R, "--variant", "gpt"], "cannot change the model"),
    ([*R, "--order", "l2r"], "cannot change order"),
    (["train", "--out", "{t}/empty", "--resume"], "no checkpoint found"),
    (["train", "--out", "{run}", "--resume-from", "{s}/imported"], "holds no training state"),
    (["train", "--out", "{run}", "--resume-from", "{s}/cfg-no-model"], "lacks the key 'model'"),
    (["train", "--out", "{run}", "--resume-from", "{s}/cfg-bad-type"], "model config: n_layer must be int"),
    # --- sample
    ([*S, "-n", "0"], "argument --num-samples/-n: must be in [1, 100000], got 0"),
    ([*S, "-n", "-1"], "argument --num-samples/-n"),
    ([*S, "-n", "1000000000000"], "argument --num-samples/-n: must be in [1, 100000]"),
    ([*S, "--length", "0"], "argument --length: must be in [1, "),
    ([*S, "--length", "-5"], "argument --length"),
    ([*S, "--length", "100000"], "an output length of 100000 tokens does not fit the model's context of 32"),
    ([*S, "--steps", "0"], "argument --steps"),
    ([*S, "--steps", "-1"], "argument --steps"),
    ([*S, "--steps", "40", "--length", "8"], "steps must lie in 1..8"),
    ([*S, "--temperature", "0"], "argument --temperature: must be > 0, got 0.0"),
    ([*S, "--temperature", "nan"], "argument --temperature: must be a finite number"),
    ([*S, "--temperature", "inf"], "argument --temperature"),
    ([*S, "--temperature", "-1"], "argument --temperature"),
    ([*S, "--top-p", "0"], "argument --top-p: must be in (0, 1]"),
    ([*S, "--top-p", "1.5"], "argument --top-p"),
    ([*S, "--top-p", "nan"], "argument --top-p"),
    ([*S, "--top-k", "-1"], "argument --top-k"),
    ([*S, "--batch-size", "0"], "argument --batch-size"),
    ([*S, "-n", "100000", "--batch-size", "100000", "--no-cache"], "generation needs about"),
    ([*S, "--infill", "[MASK:99999999999]"], "the template of 99999999999 tokens does not fit"),
    ([*S, "--infill", "a [MASK:0] b"], "bad blank '[MASK:0]'"),
    ([*S, "--infill", "a [MASK:-1] b"], "bad blank '[MASK:-1]'"),
    ([*S, "--infill", "a [MASK:x] b"], "bad blank '[MASK:x]'"),
    ([*S, "--infill", "no blanks at all"], "has no blank"),
    ([*S, "--known", "0=5"], "--known needs the output --length"),
    ([*S, "--known", "a=b", "--length", "8"], "cannot read known token 'a=b'"),
    ([*S, "--known", "0=999999", "--length", "8"], "outside the model's vocabulary"),
    ([*S, "--known", "99=1", "--length", "8"], "outside 0..7"),
    ([*S, "--known", "0=99999999999999999999", "--length", "8"], "cannot read known token"),
    ([*S, "--order", "0,0,1", "--length", "3"], "not a permutation"),
    ([*S, "--order", "1,2,3", "--length", "8"], "must have shape"),
    ([*S, "--order", "99999999999999999999,1", "--length", "2"], "beyond any context"),
    ([*S, "--order", "sideways"], "unknown order spec"),
    ([*S, "--prompt", "x" * 40, "--length", "8"], "leaving nothing to generate"),
    ([*S, "--policy", "greedy"], "invalid choice"),
    ([*S, "--weights", "best"], "invalid choice"),
    ([*S, "--device", "tpu"], "unknown device"),
    (["sample", "--checkpoint", "{s}/nothing-here"], "does not exist"),
    (["sample", "--checkpoint", "{data}"], "no checkpoint found"),
    (["sample", "--checkpoint", "{s}/cfg-no-model"], "lacks the key 'model'"),
    (["sample", "--checkpoint", "{s}/cfg-model-list"], "model must be dict"),
    (["sample", "--checkpoint", "{s}/cfg-nan"], "model config: dropout must be a finite number"),
    (["sample", "--checkpoint", "{s}/cfg-step"], "step must be int"),
    (["sample", "--checkpoint", "{s}/cfg-variant"], "unknown variant"),
    (["sample", "--checkpoint", "{s}/cfg-not-json"], "is not valid JSON"),
    # --- eval
    ([*E, "--block-len", "0"], "argument --block-len"),
    ([*E, "--block-len", "-1"], "argument --block-len"),
    ([*E, "--block-len", "10000000"], "argument --block-len"),
    ([*E, "--block-len", "1000"], "exceeds the model's context of 32"),
    ([*E, "--batch-size", "0"], "argument --batch-size"),
    ([*E, "--batch-size", "-3"], "argument --batch-size"),
    ([*E, "--max-batches", "0"], "argument --max-batches"),
    ([*E, "-K", "0"], "argument --num-orders/-K"),
    ([*E, "-K", "1000000000"], "argument --num-orders/-K: must be in [1, 10000]"),
    ([*E, "-M", "0"], "argument --ensemble/-M"),
    ([*E, "--ensemble-positions", "0"], "argument --ensemble-positions"),
    ([*E, "--order", "sideways"], "unknown order spec"),
    ([*E, "--dtype", "int8"], "unknown precision 'int8'"),
    ([*E, "--batch-size", "1000000"], "evaluation needs about"),
    (["eval", "--checkpoint", "{run}", "--data", "{s}/bad-ids"], "outside the model's vocabulary"),
    (["eval", "--checkpoint", "{run}", "--data", "{s}/meta-type"], "vocab_size must be int"),
    (["eval", "--checkpoint", "{run}", "--data", "no-such-set"], "unknown data"),
    (["eval", "--checkpoint", "{run}"], "nothing to evaluate"),
    (["eval", "--checkpoint", "{run}", "--suite", "imdb"], "unknown evaluation set"),
    (["eval", "--checkpoint", "{run}", "--genppl-samples", "0"], "argument --genppl-samples"),
    (["eval", "--checkpoint", "{run}", "--genppl-samples", "2"], "needs an evaluator"),
    (["eval", "--checkpoint", "{run}", "--genppl-samples", "2", "--temperature", "nan"], "argument --temperature"),
    (["eval", "--checkpoint", "{run}", "--genppl-samples", "2", "--top-p", "2"], "argument --top-p"),
    (["eval", "--checkpoint", "{run}", "--genppl-samples", "2", "--gen-steps", "0"], "argument --gen-steps"),
    # --- prepare
    ([*P, "--val-fraction", "nan"], "argument --val-fraction: must be a finite number"),
    ([*P, "--val-fraction", "-0.1"], "argument --val-fraction"),
    ([*P, "--val-fraction", "1"], "argument --val-fraction: must be in (0, 1)"),
    ([*P, "--val-docs", "-3"], "argument --val-docs"),
    ([*P, "--val-docs", "0"], "argument --val-docs"),
    ([*P, "--max-docs", "0"], "argument --max-docs"),
    ([*P, "--workers", "0"], "argument --workers"),
    ([*P, "--workers", "100000"], "argument --workers: must be in [1, 1024]"),
    ([*P, "--shard-tokens", "0"], "argument --shard-tokens"),
    ([*P, "--shard-tokens", "abc"], "argument --shard-tokens: must be an integer"),
    ([*P, "--tokenizer", "bpe:0"], "bpe"),
    ([*P, "--tokenizer", "bpe:99999999999"], "bpe"),
    ([*P, "--tokenizer", "nope"], "unknown tokenizer spec"),
    ([*P, "--txt-docs", "lines"], "invalid choice"),
    ([*P, "--resume", "--restart"], "not allowed with argument"),
    (["prepare", "--corpus", "{s}/nothing.txt", "--tokenizer", "bytes", "--out", "{t}/p"], "does not exist"),
    (["prepare", "--corpus", "{s}/corpus", "--tokenizer", "bytes", "--out", "{s}/a-file"],
     "exists and is not a directory"),
    (["prepare", "--corpus", "{s}/corpus", "--tokenizer", "bytes", "--out", "/proc/aogpt-nowhere/p"], "cannot"),
    (["prepare", "--corpus", "{s}/corpus", "--tokenizer", "bytes", "--out", "/proc/aogpt-nowhere"], "cannot"),
    # --- bench
    ([*BG, "--long-run", "nan"], "argument --long-run: must be a finite number"),
    ([*BG, "--long-run", "-1"], "argument --long-run"),
    ([*BG, "--n", "0"], "argument --n"),
    ([*BG, "--n", "1000000"], "the generate benchmark needs about"),
    ([*BG, "--batch", "0"], "argument --batch"),
    ([*BG, "--steps", "0,1"], "bad steps list"),
    ([*BG, "--steps", "abc"], "bad steps list"),
    ([*BG, "--methods", "foo"], "unknown method"),
    ([*BG, "--top-p", "0"], "argument --top-p"),
    ([*BG, "--temperature", "nan"], "argument --temperature"),
    ([*BG, "--repeats", "0"], "argument --repeats"),
    ([*BG, "--layers", "0"], "argument --layers"),
    ([*BG, "--width", "30", "--heads", "4"], "width divisible"),
    ([*BG, "--vocab", "-1"], "argument --vocab"),
    ([*BG, "--threads", "0"], "argument --threads"),
    (["bench", "generate", "--quick", "--out", "/proc/aogpt-nowhere/b"], "cannot create directory"),
    ([*BD, "--n", "0"], "argument --n"),
    ([*BD, "--long-run", "inf"], "argument --long-run"),
    ([*BD, "--repeats", "-1"], "argument --repeats"),
    ([*BD, "--n", "200000", "--batch", "64"], "the score benchmark needs about"),
    ([*BT, "--steps", "0"], "argument --steps"),
    ([*BT, "--warmup", "-1"], "argument --warmup"),
    ([*BT, "--block", "0"], "argument --block"),
    ([*BT, "--variants", "foo"], "unknown variant"),
    ([*BT, "--batch", "0"], "argument --batch"),
    ([*BT, "--batch", "1000000"], "the train benchmark needs about"),
    ([*BE, "--members", "1"], "argument --members"),
    ([*BE, "--n", "0"], "argument --n"),
    ([*BE, "--batch", "0"], "argument --batch"),
    ([*BP, "--repeats", "0"], "argument --repeats"),
    ([*BP, "--threads", "0"], "argument --threads"),
    (["bench", "prepare", "--workers-bench", "--workers", "0", "--out", "{t}/b"], "argument --workers"),
    (["bench", "prepare", "--workers-bench", "--synthetic-mb", "nan", "--out", "{t}/b"], "argument --synthetic-mb"),
    (["bench", "prepare", "--workers-bench", "--synthetic-mb", "-1", "--out", "{t}/b"], "argument --synthetic-mb"),
    ([*BP, "--max-docs", "0"], "argument --max-docs"),
    ([*BP, "--tokenizer", "bpe:0"], "bpe"),
    (["bench", "--out", "{t}/b"], "invalid choice"),
    (["bench"], "no benchmark named"),
    # --- import / export
    (["import", "{s}/nothing.pt", "--out", "{t}/x"], "nothing.pt"),
    (["import", "{s}/garbage.pt", "--out", "{t}/x"], "garbage.pt"),
    (["import", "{s}/garbage.pt", "--out", "{t}/x", "--weights", "foo"], "invalid choice"),
    (["import", "{s}/garbage.pt", "--out", "{run}"], "already exists"),
    (["import", "{s}/garbage.pt", "--out", "/proc/aogpt-nowhere/x"], "cannot"),
    (["export", "{run}", "--out", "{t}/x.pt", "--weights", "foo"], "invalid choice"),
    (["export", "{s}/nothing-here", "--out", "{t}/x.pt"], "does not exist"),
    (["export", "{run}", "--out", "{t}/x.pt", "--format", "nanogpt"], "invalid choice"),
    (["export", "{run}", "--out", "/proc/aogpt-nowhere.pt"], "cannot"),
    (["export", "{run}", "--out", "{s}/a-file"], "already exists"),
    (["export", "{run}", "--out", "{s}"], "already exists"),
    (["export", "{s}/cfg-no-model", "--out", "{t}/x.pt"], "lacks the key 'model'"),
    # aogpt serve / bench serve: refused before a model is loaded or a port is taken
    (["serve"], "the following arguments are required: --checkpoint"),
    (["serve", "--checkpoint", "{run}", "--port", "-1"], "argument --port: must be in [0, 65535], got -1"),
    (["serve", "--checkpoint", "{run}", "--port", "65536"], "argument --port: must be in [0, 65535]"),
    (["serve", "--checkpoint", "{run}", "--port", "http"], "argument --port: must be an integer"),
    (["serve", "--checkpoint", "{run}", "--max-sequences", "0"], "argument --max-sequences"),
    (["serve", "--checkpoint", "{run}", "--max-queue", "-1"], "argument --max-queue"),
    (["serve", "--checkpoint", "{run}", "--max-tokens-in-flight", "nan"], "argument --max-tokens-in-flight"),
    (["serve", "--checkpoint", "{run}", "--max-samples", "0"], "argument --max-samples"),
    (["serve", "--checkpoint", "{run}", "--host", "no such host!", "--port", "0"], "cannot listen on no such host!"),
    (["serve", "--checkpoint", "{s}/nothing-here", "--port", "0"], "does not exist"),
    (["serve", "--checkpoint", "{s}/cfg-no-model", "--port", "0"], "lacks the key 'model'"),
    (["bench", "serve"], "the following arguments are required: --checkpoint"),
    (["bench", "serve", "--checkpoint", "{run}", "--clients", "0"], "argument --clients: must be in [1, 256]"),
    (["bench", "serve", "--checkpoint", "{run}", "--duration", "-5"], "argument --duration"),
    (["bench", "serve", "--checkpoint", "{run}", "--duration", "inf"], "argument --duration"),
    (["bench", "serve", "--checkpoint", "{run}", "--max-tokens", "500", "--out", "{t}/b"],
     "--max-tokens 500 exceeds the model's context of 32"),
    (["bench", "serve", "--checkpoint", "{s}/nothing-here", "--out", "{t}/b"], "does not exist"),
    # --- adapt: only causal decoders of a supported family, with a tokenizer that fits; nothing written
    (["adapt", "--from", "{s}/nothing-here", "--out", "{t}/a"], "does not exist"),
    (["adapt", "--from", "{s}/a-file", "--out", "{t}/a"], "does not exist"),
    (["adapt", "--from", "{run}", "--out", "{t}/a"], "reads any order already"),
    (["adapt", "--from", "{s}/hf-bert", "--out", "{t}/a"], "is not a causal (left-to-right) language model"),
    (["adapt", "--from", "{s}/hf-neox", "--out", "{t}/a"], "architecture GPTNeoXForCausalLM"),
    (["adapt", "--from", "{s}/hf-llama-gpt2-tokenizer", "--out", "{t}/a"], "the tokenizer has 50257 tokens"),
    (["adapt", "--from", "{s}/hf-llama-no-tokenizer", "--out", "{t}/a"], "has no tokenizer files"),
    (["adapt", "--from", "{s}/hf-llama-bad-tokenizer", "--out", "{t}/a"], "has no tokenizer that loads"),
    (["adapt", "--from", "{s}/imported", "--out", "{s}"], "already exists"),
    (["adapt", "--from", "{run}", "--variant", "gpt", "--out", "{t}/a"], "invalid choice"),
    (["adapt", "--from", "{run}", "--out", "{t}/a", "--block-size", "0"], "argument --block-size"),
    (["bench", "adapt", "--steps", "0", "--out", "{t}/b"], "argument --steps"),
    (["bench", "adapt", "--finetune", "10,x", "--out", "{t}/b"], "argument --finetune"),
    (["bench", "adapt", "--candidates", "recipe-fast,nope", "--out", "{t}/b"], "unknown candidate or path 'nope'"),
]


def _copy_checkpoint(src: Path, dst: Path, edit) -> None:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(edit(cfg) if callable(edit) else edit)


def _meta(data: Path, dst: Path, edit) -> None:
    shutil.copytree(data, dst)
    meta = json.loads((dst / "meta.json").read_text())
    (dst / "meta.json").write_text(json.dumps(edit(meta)))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, bytes_data, tiny_run) -> Path:
    """Damaged and foreign inputs, built once."""
    import aogpt
    from tests.conftest import make_corpus

    s = tmp_path_factory.mktemp("malformed")
    make_corpus(s / "corpus", docs=3, words=80)
    (s / "a-file").write_text("not a directory\n")
    (s / "garbage.pt").write_bytes(b"\x80\x04 this is not a checkpoint" * 10)
    (s / "bad-type.json").write_text('{"train": {"lr": "x"}}')
    (s / "nan.toml").write_text("[model]\ndropout = nan\n")
    (s / "list.json").write_text("[1, 2]")
    (s / "preset-number.json").write_text('{"preset": 3}')
    _meta(bytes_data, s / "meta-missing", lambda m: {k: v for k, v in m.items() if k != "dtype"})
    _meta(bytes_data, s / "meta-type", lambda m: {**m, "vocab_size": "257"})
    _meta(bytes_data, s / "meta-escape", lambda m: {**m, "splits": {**m["splits"], "train": {
        **m["splits"]["train"], "file": "../../../etc/passwd"}}})
    _meta(bytes_data, s / "meta-splits", lambda m: {**m, "splits": ["train", "val"]})
    _meta(bytes_data, s / "meta-list", lambda m: [m])
    shutil.copytree(bytes_data, s / "bad-ids")
    ids = np.memmap(s / "bad-ids" / "train.bin", dtype=np.uint16, mode="r+")
    ids[len(ids) // 2] = 60000  # one id far outside the 320-id vocabulary, mid-file
    ids.flush()
    del ids
    (s / "bad-ids" / "val.bin").write_bytes(np.full(
        (s / "bad-ids" / "val.bin").stat().st_size // 2, 60000, dtype=np.uint16).tobytes())
    ckpt = list_checkpoints(tiny_run)[-1]
    _copy_checkpoint(ckpt, s / "cfg-no-model", lambda c: json.dumps({k: v for k, v in c.items() if k != "model"}))
    _copy_checkpoint(ckpt, s / "cfg-bad-type", lambda c: json.dumps({**c, "model": {**c["model"], "n_layer": "two"}}))
    _copy_checkpoint(ckpt, s / "cfg-model-list", lambda c: json.dumps({**c, "model": [1, 2]}))
    _copy_checkpoint(ckpt, s / "cfg-nan", lambda c: json.dumps({**c, "model": {**c["model"], "dropout": math.nan}}))
    _copy_checkpoint(ckpt, s / "cfg-step", lambda c: json.dumps({**c, "step": "six"}))
    _copy_checkpoint(ckpt, s / "cfg-variant", lambda c: json.dumps({**c, "model": {**c["model"], "variant": "bert"}}))
    _copy_checkpoint(ckpt, s / "cfg-not-json", "{not json")
    loaded = aogpt.load(tiny_run)
    aogpt.save(loaded.model, s / "imported", tokenizer=loaded.tokenizer, step=6)
    _foreign_models(s)
    return s


def _foreign_models(s: Path) -> None:
    """transformers folders that `aogpt adapt` refuses (configs are enough where it refuses before the weights)."""
    from transformers import BertConfig, GPTNeoXConfig

    from tests.adaptation.conftest import _fast_tokenizer, make_hf

    BertConfig(architectures=["BertForMaskedLM"], num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
               intermediate_size=8).save_pretrained(s / "hf-bert")
    GPTNeoXConfig(architectures=["GPTNeoXForCausalLM"], num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                  intermediate_size=8).save_pretrained(s / "hf-neox")
    llama = make_hf(s, "llama")
    shutil.copytree(llama, s / "hf-llama-no-tokenizer", ignore=shutil.ignore_patterns("tokenizer*", "special*"))
    shutil.copytree(llama, s / "hf-llama-bad-tokenizer")
    (s / "hf-llama-bad-tokenizer" / "tokenizer.json").write_text("{not json")
    llama.rename(s / "hf-llama-gpt2-tokenizer")
    _fast_tokenizer("gpt2", True).save_pretrained(s / "hf-llama-gpt2-tokenizer")


def snapshot(*roots: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under `roots`: (size, mtime in ns, mode)."""
    out = {}
    for root in roots:
        for p in [root, *root.rglob("*")]:
            st = p.lstat()
            out[str(p)] = (st.st_size if p.is_file() else 0, st.st_mtime_ns if p.is_file() else 0, st.st_mode)
    return out


def test_the_corpus_is_large_and_covers_every_command():
    assert len(CASES) >= 100
    commands = {" ".join(argv[:2]) if argv[:1] == ["bench"] else " ".join(argv[:1]) for argv, _ in CASES}
    assert {"", "prepare", "train", "sample", "eval", "import", "export", "bench generate", "bench density",
            "bench train", "bench eval", "bench prepare"} <= commands


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(a)[:80] for a, _ in CASES])
def test_malformed_invocation(argv, expected, cli, bytes_data, tiny_run, sandbox, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default outputs (bench-results) land here
    meminfo = tmp_path / "meminfo"  # the same available memory on every machine: 4 GiB
    meminfo.write_text(f"MemTotal: {8 * 2**20} kB\nMemAvailable: {4 * 2**20} kB\n")
    monkeypatch.setattr("aogpt.memory.MEMINFO", meminfo)
    monkeypatch.delenv("AOGPT_SKIP_MEMORY_CHECK", raising=False)
    fill = {"data": bytes_data, "run": tiny_run, "ckpt": list_checkpoints(tiny_run)[-1], "s": sandbox,
            "t": tmp_path / "new"}
    args = [a.format(**fill) for a in argv]
    expected = expected.format(**fill)
    before = snapshot(bytes_data, tiny_run, sandbox)
    result = cli(*args)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert result.code == 2, (args, result.err[-2000:])
    assert "Traceback" not in result.err
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    assert expected in lines[0], lines[0]
    assert snapshot(bytes_data, tiny_run, sandbox) == before
