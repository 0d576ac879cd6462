"""`aogpt train`: the flags, handed to the library's resolver (`aogpt.train.plan`), which decides and
checks the run and trains it (`RunPlan.run`). Here: the parser, the plan line, the dry-run report and
the summary."""

from __future__ import annotations

import argparse
from typing import Any

from aogpt import compiling
from aogpt.cli.common import add_common, config_arg, emit_json, finite_float, path_arg
from aogpt.config import ModelConfig, TrainConfig
from aogpt.precision import AUTOCAST, name_of, precision_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (any variant) on prepared data",
        description="Train GPT, sigma-GPT, AO-GPT or the encoder-only MDM on a prepared data "
        "directory. Runs under torchrun for DDP/FSDP.",
    )
    p.add_argument("--preset", default=None,
                   help="size and recipe: tiny, quickstart, cpu-small (default), gpt2-small, gpt2-medium")
    p.add_argument("--variant", default=None, help="gpt, sigma, aogpt (default) or encoder-mdm")
    p.add_argument("--data", type=path_arg, help="prepared data directory (from `aogpt prepare`)")
    p.add_argument("--out", type=path_arg, required=True, help="run directory (checkpoints, metrics, plot)")
    p.add_argument("--config", type=path_arg, help="JSON/TOML file with [model] and [train] overrides")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set model.n_layer=6 --set train.warmup_steps=10",
    )
    p.add_argument(
        "--order",
        help="order distribution: l2r, uniform, mixture[:P], fixed-random[:SEED], "
        "blockwise[:K[:SEED]], mallows:THETA, window:W (default per variant)",
    )
    p.add_argument("--fim-rate", type=config_arg(TrainConfig, "fim_rate"), metavar="R",
                   help="fill in the middle (variant gpt): the share of training rows cut into prefix, middle and "
                   "suffix and rearranged with sentinel tokens, in [0, 1] (default 0: none; docs/training.md)")
    p.add_argument("--fim-spm-rate", type=config_arg(TrainConfig, "fim_spm_rate"), metavar="R",
                   help="of those rows, the share in suffix-prefix-middle order rather than prefix-suffix-middle "
                   "(default 0.5)")
    p.add_argument("--max-steps", type=config_arg(TrainConfig, "max_steps"),
                   help="optimizer steps; the cosine schedule ends here")
    p.add_argument("--max-minutes", type=config_arg(TrainConfig, "max_minutes"),
                   help="stop after this much training time")
    p.add_argument("--batch-size", type=config_arg(TrainConfig, "batch_size"),
                   help="sequences per micro-batch per process")
    p.add_argument("--grad-accum", type=config_arg(TrainConfig, "grad_accum"), help="micro-batches per step")
    p.add_argument("--global-batch-tokens", type=config_arg(TrainConfig, "global_batch_tokens"),
                   help="derive accumulation from a global batch in tokens")
    p.add_argument("--block-size", type=config_arg(ModelConfig, "block_size"),
                   help="context length (the model's block size)")
    p.add_argument("--lr", type=config_arg(TrainConfig, "lr"), help="peak learning rate, in (0, 1]")
    p.add_argument("--eval-interval", type=config_arg(TrainConfig, "eval_interval"))
    p.add_argument("--ckpt-interval", type=config_arg(TrainConfig, "ckpt_interval"))
    p.add_argument("--keep-last", type=config_arg(TrainConfig, "keep_last"),
                   help="checkpoints to keep (default 2; 0 keeps all)")
    p.add_argument("--ema-decay", type=config_arg(TrainConfig, "ema_decay"), help="EMA decay, in [0, 1)")
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--dtype", type=precision_arg(AUTOCAST), metavar="P",
                   help="auto (bf16 autocast on a GPU or a CPU with bf16 units, else fp32), fp32 (float32), "
                   "bf16 (bfloat16), fp16 (float16)")
    p.add_argument("--compile", choices=("auto", "on", "off"),
                   help="torch.compile the training step: auto (default: for runs of 5 minutes or more, where a "
                   "C++ compiler is found on the CPU; the compile time counts in --max-minutes), on, off")
    p.add_argument("--fsdp", action="store_const", const=True,
                   help="shard with FSDP2 instead of DDP (under torchrun; CUDA, or CPU with gloo)")
    p.add_argument("--init-from", type=str, help="start from the raw weights of this checkpoint")
    p.add_argument("--resume", action="store_true", help="continue the newest checkpoint in --out")
    p.add_argument("--resume-from", type=path_arg, help="continue from this checkpoint directory")
    p.add_argument("--extend-to", type=config_arg(TrainConfig, "max_steps"), metavar="N",
                   help="with --resume: train on to step N, past the run's --max-steps; the learning rate "
                   "keeps the original schedule up to its end and stays at min_lr after it")
    p.add_argument("--dry-run", action="store_true", help="print the plan (sizes, batch, memory, time) and exit")
    p.add_argument(
        "--assume-tflops",
        type=finite_float(gt=0, le=1e6),
        default=400.0,
        help="achieved TFLOP/s per device used by --dry-run's time estimate (default 400)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_common(p, seed=False)
    p.add_argument("--seed", type=config_arg(TrainConfig, "seed"), help="random seed, 0..2^62 (default 1337)")
    p.set_defaults(func=run)


# the flags that are not config fields, passed to `aogpt.train.plan` under their own names
RUN_OPTIONS = ("data", "preset", "variant", "config", "resume", "resume_from", "extend_to", "dry_run")


def plan_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """`aogpt.train.plan`'s keywords from the flags: the run's options, ``--set`` as its overrides, and
    every flag named after a config field (``--lr``, ``--block-size``, ...) as that field."""
    from aogpt.train.planning import CONFIG_FIELDS

    inputs = {name: getattr(args, name) for name in RUN_OPTIONS}
    fields = {name: value for name, value in vars(args).items()
              if name in CONFIG_FIELDS and name not in inputs and value is not None}
    return {"out": args.out, **inputs, "overrides": args.set, "show_progress": not args.no_progress, **fields}


def run(args: argparse.Namespace) -> int:
    from aogpt.train.planning import plan, run_lock

    with run_lock(args.out, dry_run=args.dry_run):  # one writer per run directory
        run_plan = plan(**plan_inputs(args))
        if args.dry_run:
            return _dry_run(run_plan, args)
        if run_plan.info.is_main and run_plan.resume_from is None:
            _print_plan(run_plan)
        summary = run_plan.run()
    if run_plan.info.is_main:
        _print_summary(summary)
        if args.json:
            emit_json(summary)
    return 0


def _dry_run(plan: Any, args: argparse.Namespace) -> int:
    from aogpt.train.planning import dry_run_report

    report = dry_run_report(plan, args.assume_tflops)
    for key, value in report.items():
        print(f"{key:>28}: {value}")
    if args.json:
        emit_json(report)
    return 0


def _print_plan(plan: Any) -> None:
    """Before the first step: what will be trained, how long, where; the orders and the rate's schedule."""
    from aogpt.curriculum import make_curriculum
    from aogpt.device import resolve_device
    from aogpt.train import LRSchedule, accumulation_steps, training_precision
    from aogpt.train.recipe import describe as describe_recipe

    mc, tc = plan.model_cfg, plan.train_cfg
    sequences = tc.batch_size * accumulation_steps(tc, plan.info.world_size, mc.block_size) * plan.info.world_size
    schedule = LRSchedule(tc)
    if schedule.time_budgeted:
        length = (f"{tc.max_minutes:g} minutes (as many steps as fit, at most {tc.max_steps:,}; counted after the "
                  "first steps)")
    else:
        limit = f", at most {tc.max_minutes:g} minutes" if tc.max_minutes > 0 else ""
        length = f"{tc.max_steps:,} steps{limit}"
    print(f"training {mc.variant} ({mc.n_layer} layers, width {mc.n_embd}, context {mc.block_size}) on "
          f"{sequences} x {mc.block_size} tokens a step for {length} -> {plan.out}", flush=True)
    curriculum = make_curriculum(tc.curriculum, tc.order, tc.l2r_first_steps, tc.decay_steps)
    orders = f"orders: {curriculum.final.spec}"
    if curriculum.stages:
        shares = f" ({curriculum.spec} of {tc.decay_steps:,} steps)" if "%" in curriculum.spec else ""
        orders = f"orders: {curriculum.resolved} (step@end{shares}), then {curriculum.final.spec}"
    print(f"{orders}; {schedule.describe()}", flush=True)
    if tc.fim_rate > 0:
        print(f"fill in the middle: {100 * tc.fim_rate:g}% of the rows cut into prefix, middle and suffix ("
              f"{100 * tc.fim_spm_rate:g}% of them in suffix-prefix-middle order), sentinel ids {mc.fim_tokens}",
              flush=True)
    if plan.recipe_why:
        print(plan.recipe_why, flush=True)
    if mc.pathway == "gated":
        print(f"gated pathway (delta rank {mc.pathway_rank or 'full'}): the source's weights frozen and alone on the "
              "slots that read left to right, which stay the source's exactly; the pathway trains on the others",
              flush=True)
    if describe_recipe(tc):
        print(describe_recipe(tc), flush=True)
    device = resolve_device(tc.device)
    amp, why = training_precision(tc, device)
    print(f"precision: {why} (fp32 weights and optimizer state)", flush=True)
    if plan.sizing_why:
        print(plan.sizing_why, flush=True)
    compiled, how = compiling.decide_training(tc.compile, device, max_minutes=tc.max_minutes,
                                              world_size=plan.info.world_size, fsdp=tc.fsdp, precision=name_of(amp))
    where = f"; kernels cached in {compiling.cache_dir()}, so a second run compiles in seconds" if compiled else ""
    print(f"compile: {how}{where}", flush=True)


def _validation_heading(s: dict[str, Any]) -> str:
    """What the summary's validation scored: the run's validation reads the first batches of the
    held-out text, `aogpt eval` all of it, so the two figures differ and the heading says which."""
    scored, whole = s.get("val_tokens"), s.get("val_split_tokens")
    if not scored:
        return "validation on the held-out text:"
    if whole is not None and scored >= whole:
        return f"validation on the whole held-out text ({scored:,} tokens):"
    if whole is None:
        return f"validation on the first {scored:,} tokens of the held-out text ({s['val_batches']} batches):"
    return (f"validation on the first {scored:,} of the held-out text's {whole:,} tokens ({s['val_batches']} batches; "
            "aogpt eval scores them all):")


def _print_summary(s: dict[str, Any]) -> None:
    """What was trained and how far it got; validation in nats, perplexity and bits per byte; a
    warning when a time limit or a signal cut the run short; where the files are."""
    from aogpt.measures import describe_loss
    from aogpt.progress import duration

    done, planned = s["step"], s.get("planned_steps", s["step"])
    print(f"trained {s.get('variant', 'the model')} ({s['params'] / 1e6:.1f} M parameters) for {done:,} of {planned:,} "
          f"planned steps: {s['tokens_seen']:,} tokens in {duration(s['train_seconds'])}, "
          f"{s['tokens_per_s']:,.0f} tokens/s")
    print(_validation_heading(s))
    keys = [k.split("/") for k in s if k.startswith("val/")]
    for _, kind, weights in sorted(keys, key=lambda k: (k[2] != "ema", k[1] != "l2r")):
        key = f"val/{kind}/{weights}"
        label = "left to right" if kind == "l2r" else "any order"
        print(f"  {label:>13}, {weights} weights: {describe_loss(s[key], s.get(f'bpb/{kind}/{weights}'))}")
    if s["stopped_by"] == "time" and s.get("ended_as_planned"):
        print(f"the {s['max_minutes']:g}-minute budget ended the run as planned, during its learning-rate decay "
              f"({100 * s.get('decay_done', 1.0):.0f}% of the decay done, step {done:,} of {planned:,})")
    elif s["stopped_by"] == "time" and done < planned:
        print(f"warning: the time limit ({s['max_minutes']:g} minutes) stopped training after {done:,} of {planned:,} "
              f"planned steps ({100 * done // max(planned, 1)}%). The model is undertrained: the validation above "
              "is what it reached, and its samples will be poor. On a busy machine allow more time "
              "(--max-minutes) or run again when it is quieter.")
    elif s["stopped_by"] not in ("max_steps", "time"):
        print(f"stopped by {s['stopped_by']} after {done} of {planned} planned steps; continue with --resume")
    if s.get("against_source"):
        print(f"against the start (the source, step 0): {s['against_source']}")
    print(f"checkpoint: {s['checkpoint']}")
    if s.get("plot"):
        print(f"loss plot:  {s['plot']}")
