"""`aogpt harness`: run lm-evaluation-harness tasks on a checkpoint with exact likelihoods.

The harness's own command line cannot load our model (it would have to import aogpt first), so this
command registers the model "aogpt" (`aogpt.hf.harness`) and calls ``lm_eval.simple_evaluate``.
What is exact and what is a bound: docs/ecosystem.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aogpt.cli.common import add_common, emit_json, int_arg, nonnegative_int, positive_int
from aogpt.errors import AOGPTError

HELP = "run lm-evaluation-harness tasks on a checkpoint (exact left-to-right likelihoods, or the any-order bound)"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("harness", help=HELP, description=HELP + " (see docs/ecosystem.md)")
    p.add_argument("--checkpoint", required=True, metavar="RUN",
                   help="a run directory (its newest checkpoint), a ckpt-* directory or an exported folder")
    p.add_argument("--tasks", required=True, metavar="T[,T]", help="comma-separated harness task names")
    p.add_argument("--include-path", metavar="DIR", type=Path, action="append", default=[],
                   help="a folder of task YAML files (repeatable); the built-in tasks are searched only for "
                   "names not found here")
    p.add_argument("--order", default="l2r",
                   help="l2r (default: exact likelihoods) or random (the any-order bound over K orders)")
    p.add_argument("--num-orders", "-K", type=int_arg(ge=1, le=10_000), default=8, metavar="K",
                   help="orders per request for --order random (default 8)")
    p.add_argument("--weights", choices=("ema", "raw"), default="ema", help="EMA (default) or raw weights")
    p.add_argument("--batch-size", type=int_arg(ge=1, le=65_536), default=16, help="requests per forward (default 16)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N",
                   help="only the first N documents of each task")
    p.add_argument("--num-fewshot", type=nonnegative_int, default=None, metavar="N",
                   help="few-shot examples per prompt")
    p.add_argument("--bootstrap-iters", type=int_arg(ge=0, le=1_000_000), default=1000, metavar="N",
                   help="bootstrap resamples for the harness's standard errors of perplexities (default 1000; "
                   "0 skips them)")
    p.add_argument("--gen-order", default="l2r",
                   help="order in which generation tasks fill the continuation: l2r (default) or random "
                   "(sigma and AO-GPT)")
    p.add_argument("--max-gen-toks", type=int_arg(ge=1, le=1_000_000), default=256,
                   help="tokens generated at most per request (default 256)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    add_common(p)
    p.set_defaults(func=run)


def _task_manager(names: list[str], include: list[Path]) -> Any:
    """Local tasks first; the (slow to index) built-in ones only when a name is not found locally."""
    from lm_eval.tasks import TaskManager

    for path in include:
        if not path.is_dir():
            raise AOGPTError(f"task folder {path} does not exist", "pass a folder of task YAML files")
    paths = [str(p.resolve()) for p in include]
    if paths:
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    manager = TaskManager(include_path=paths or None)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise AOGPTError(f"unknown harness task(s): {', '.join(unknown)}",
                         "check the names (lm-eval --tasks list) or pass --include-path for local task files")
    return manager


def run(args: argparse.Namespace) -> int:
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not names:
        raise AOGPTError("no task names given", "pass --tasks T[,T]")
    import lm_eval
    from lm_eval.utils import make_table

    from aogpt.hf.harness import AOGPTLM

    lm = AOGPTLM(args.checkpoint, weights=args.weights, order=args.order, K=args.num_orders,
                 batch_size=args.batch_size, device=args.device, seed=args.seed, gen_order=args.gen_order,
                 max_gen_toks=args.max_gen_toks)
    manager = _task_manager(names, args.include_path)
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=args.limit,
                                          num_fewshot=args.num_fewshot, bootstrap_iters=args.bootstrap_iters,
                                          log_samples=False, random_seed=args.seed, numpy_random_seed=args.seed,
                                          torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    except OSError as exc:  # a built-in task's data set could not be downloaded or read
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AOGPTError(f"a task's data could not be read ({first})",
                         "built-in tasks download their data from the Hugging Face hub: run once online, "
                         "or use local task files with --include-path") from None
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    bound = lm.bound_report()
    how = "exact left-to-right likelihoods"
    if bound is not None:
        how = (f"any-order bound with K = {bound['K']} random orders per request; Monte-Carlo standard error of "
               f"the summed log-likelihood of {bound['requests']} requests: {bound['logprob_sum_se']:.4f} nats "
               f"(sum {bound['logprob_sum']:.4f})")
    print(f"{lm.model.config.variant} from {args.checkpoint}: {how}")
    if args.json:
        metrics = {task: {k: v for k, v in values.items() if k != "alias"}
                   for task, values in results["results"].items()}
        emit_json({"command": "harness", "checkpoint": str(args.checkpoint), "tasks": names, "order": args.order,
                   "results": metrics, "bound": bound})
    return 0
