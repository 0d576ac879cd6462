"""Helpers shared by the trainer tests: a tiny run on random tokens, its metrics, a fake signal."""

from __future__ import annotations

import json

from aogpt.config import model_config, train_config
from aogpt.train import RandomTokens, Trainer

TIMING = {"tokens_per_s", "mfu"}


def make(out, variant="aogpt", **train_over):
    mc = model_config(variant, preset="tiny", vocab_size=40)
    tc = train_config("tiny", variant, **{"max_steps": 12, "eval_interval": 6, "ckpt_interval": 6,
                                          "log_interval": 2, "keep_last": 5, **train_over})
    return Trainer(mc, tc, RandomTokens(40), out, show_progress=False)


def records(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def stop_after(trainer, step, name="SIGTERM"):
    inner = trainer.train_step

    def wrapped():
        result = inner()
        if trainer.step == step:
            trainer._stop_signal = name
        return result

    trainer.train_step = wrapped
