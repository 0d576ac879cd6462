"""How big `aogpt reproduce` runs: model size, steps, evaluation and analysis sizes.

Every run of one command has the same size, data, batch and number of steps (the budget is in
steps, hence in tokens: results do not depend on how busy the machine is). `DEFAULT` takes about 50
minutes of one CPU core (every distinct run timed once and extrapolated; about half with two processes
on two cores, `--jobs 2`); `QUICK` is a smoke test of the whole pipeline in about a minute.
`--budget-minutes` keeps the size and picks the steps from a short timing of this machine
(`aogpt.reproduce.runner.fit_budget`).

Seeds: the training-recipe findings (`aogpt.reproduce.findings.RECIPE`) run `Scale.seeds` seeds by
default (3 at the default scale, whose steps are chosen so that their 53 runs fit the hour), the
other findings the first seed; ``--seeds N`` runs every finding at N seeds. The infilling finding's runs
have their own context (`infill_block_size`) and two budgets (`infill_budgets`, multiples of `steps`).

Every any-order decoder run (uniform, mixture or Mallows orders) starts as the library recommends
(`aogpt.config.any_order_start`: a curriculum from left to right to the run's order, the target pathway
at 10x the learning rate, adaLN's gates open): without it, AO-GPT's blocks stay on the unigram
plateau for the whole run at this size (docs/training.md). Runs in one fixed order need no target
position and start plainly.

EMA decays are scaled to the run's length. The paper's decays 0.99 / 0.999 / 0.9999 average over
about 100 / 1,000 / 10,000 steps; a run of a few hundred steps cannot hold those horizons, so each
horizon is multiplied by steps / `EMA_REFERENCE_STEPS`: the paper's 0.9999 then averages over a
fifth of the run and the others keep the paper's ratios (10x and 100x shorter). decay =
max(0, 1 - 1 / horizon).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aogpt.config import ModelConfig, TrainConfig, any_order_start, model_config, train_config
from aogpt.errors import AOGPTError
from aogpt.families import family
from aogpt.reproduce.findings import RunSpec

EMA_REFERENCE_STEPS = 50_000


@dataclass(frozen=True)
class Scale:
    name: str
    tokenizer: str = "bytes"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    block_size: int = 64
    batch_size: int = 32
    steps: int = 1800
    seeds: int = 1  # seeds of the training-recipe findings by default (`findings.RECIPE`; the others: one)
    evals: int = 6  # validations per run, evenly spaced (the curves' points; runs interleave between them)
    eval_batches: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 30
    # Finding 6: context-order ensembles on held-out sequences
    ensemble_sequences: int = 64
    ensemble_orders: int = 2
    ensemble_positions: int = 16
    encoder_draws: int = 16
    # Finding 8.2: samples per model and annealing setting, generated with T = block_size steps
    gen_samples: int = 48
    # Findings 7 / 8.1: the generation benchmark
    bench_batch: int = 8
    bench_steps: tuple[int, ...] = (8, 16, 32, 64)
    bench_repeats: int = 3
    # The infilling finding (`aogpt.reproduce.infill`): a context that holds the widest span (64) with
    # `infill_context` tokens each side and a fill-in-the-middle row's 4 sentinels, with slots to spare (a FIM
    # middle still open in the last slot must end there: `aogpt.data.fim`); two budgets, as multiples of
    # `steps`; the held-out spans scored per length.
    infill_block_size: int = 128
    infill_budgets: tuple[int, ...] = (1, 3)
    infill_context: int = 24
    infill_cuts: int = 64

    @property
    def eval_interval(self) -> int:
        return self.steps // self.evals

    def check(self) -> Scale:
        if self.steps < self.evals or self.steps % self.evals:
            raise AOGPTError(f"{self.steps} steps cannot be split into {self.evals} equal pieces",
                             f"use a multiple of {self.evals}")
        if max(self.bench_steps) != self.block_size:
            raise AOGPTError("the benchmark's largest step count must be the sequence length", "fix the scale")
        from aogpt.reproduce.findings import INFILL_BUDGET_NAMES, INFILL_LENGTHS

        if len(self.infill_budgets) != len(INFILL_BUDGET_NAMES) or \
                2 * self.infill_context + max(INFILL_LENGTHS) + 4 >= self.infill_block_size:
            raise AOGPTError("the infilling runs need two budgets and a context longer than the widest span, its "
                             "sides and four sentinels", "fix the scale")
        return self

    def infill_steps(self, budget: int) -> int:
        """Steps of the infilling finding's runs at `budget` (a multiple of `evals`, as `steps` is)."""
        return self.steps * self.infill_budgets[budget]

    def with_steps(self, steps: int) -> Scale:
        return dataclasses.replace(self, steps=steps).check()

    @property
    def tokens_per_run(self) -> int:
        return self.steps * self.batch_size * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Scale:
        data = dict(data)
        data["bench_steps"] = tuple(data["bench_steps"])
        if "infill_budgets" in data:  # absent in plans written before the infilling finding
            data["infill_budgets"] = tuple(data["infill_budgets"])
        return Scale(**data)

    def describe(self, infill: bool = False) -> str:
        text = (f"{self.n_layer} layers x {self.n_embd} wide ({self.n_head} heads), context {self.block_size}, "
                f"{self.tokenizer} tokens, batch {self.batch_size}, {self.steps} steps "
                f"({self.tokens_per_run:,} tokens per run), {self.evals} validations of {self.eval_batches} batches")
        if infill:
            text += (f"; the infilling runs: context {self.infill_block_size}, "
                     f"{' and '.join(f'{self.infill_steps(b):,}' for b in range(len(self.infill_budgets)))} steps")
        return text

    def with_seeds(self, seeds: int) -> Scale:
        return dataclasses.replace(self, seeds=seeds).check()


# 16 recipe runs x 3 seeds + 5 runs of the other findings x 1 seed = 53 runs of 1,200 steps: about 50 minutes of
# one core, measured run by run (docs/reproduce.md, "What the default costs, and --jobs"); --jobs 2 on two cores
# about half of it
DEFAULT = Scale("default", steps=1200, seeds=3).check()
QUICK = Scale("quick", n_layer=2, n_embd=32, n_head=2, block_size=32, batch_size=8, steps=24, evals=2,
              eval_batches=4, lr=3e-3, min_lr=3e-4, warmup_steps=4, ensemble_sequences=8, ensemble_orders=1,
              ensemble_positions=4, encoder_draws=2, gen_samples=4, bench_batch=2, bench_steps=(4, 8, 32),
              bench_repeats=2, infill_cuts=8).check()


def ema_decay(name: str, steps: int) -> float:
    """The paper's decay `name` ("none", "0.99", ...) scaled to a run of `steps` (module docstring)."""
    if name == "none":
        return 0.0
    horizon = 1.0 / (1.0 - float(name)) * steps / EMA_REFERENCE_STEPS
    return max(0.0, 1.0 - 1.0 / horizon) if horizon > 1 else 0.0


def configs(spec: RunSpec, scale: Scale, vocab_size: int, seed: int, device: str = "cpu",
            text_vocab: int | None = None) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configs of one run at `scale` (every run of a scale alike but for what
    its spec changes: the infilling finding's runs have their own context and budget). `text_vocab`:
    the tokenizer's own ids, after which a fill-in-the-middle run's sentinels go (`aogpt.data.fim`)."""
    block, steps = scale.block_size, scale.steps
    if spec.infill_budget is not None:
        block, steps = scale.infill_block_size, scale.infill_steps(spec.infill_budget)
    interval = steps // scale.evals
    overrides: dict[str, Any] = dict(n_layer=scale.n_layer, n_embd=scale.n_embd, n_head=scale.n_head,
                                     block_size=block, vocab_size=vocab_size, target_dim=min(128, scale.n_embd))
    if spec.target is not None:
        overrides["target"] = spec.target
    if spec.fim_rate > 0:
        from aogpt.data.fim import SENTINELS, Sentinels
        from aogpt.data.tokenizer_base import pad_vocab_size

        if text_vocab is None:
            raise AOGPTError("a fill-in-the-middle run needs the tokenizer's vocabulary size", "pass text_vocab")
        overrides.update(fim_tokens=Sentinels.after(text_vocab).to_list(),
                         vocab_size=max(vocab_size, pad_vocab_size(text_vocab + SENTINELS)))
    mc = model_config(spec.variant, **overrides)
    start = any_order_start(spec.order, steps, mc.target) if family(spec.variant).target_position else {}
    tc = train_config(None, spec.variant, order=spec.order, batch_size=scale.batch_size, max_steps=steps,
                      lr=scale.lr, min_lr=scale.min_lr, warmup_steps=scale.warmup_steps,
                      ema_decay=ema_decay(spec.ema, steps), eval_interval=interval,
                      eval_batches=scale.eval_batches, log_interval=max(1, interval // 5),
                      ckpt_interval=steps + 1, keep_last=1, seed=seed, device=device, fim_rate=spec.fim_rate, **start)
    return mc, tc
