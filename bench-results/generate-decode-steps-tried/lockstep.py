"""What was tried for the decode step, measured in lockstep (the script behind tried.json).

Several decoder samplers (teacher-forced: identical work every round) run step by step in lockstep,
one step of each in turn, and each step's CPU time (this thread's) is summed; the fastest of ROUNDS
rounds is kept per variant. On a machine shared with other jobs this pairs every variant's step with
the others' at nearly the same moment, which a whole-run comparison cannot. Draws are not timed
(teacher forcing), so a ratio here is a little larger than the same ratio with sampling.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench-results/generate-decode-steps-tried/lockstep.py OUT.json
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import time

import torch

from aogpt import capability
from aogpt.bench.common import DEFAULT_SIZE, build_model
from aogpt.generation.decoder import DecoderSampler
from aogpt.generation.plan import step_counts
from aogpt.generation.settings import GenerationSettings
from aogpt.generation.streams import SequenceStreams
from aogpt.inference import for_inference

ROUNDS = 3
B = 8


def sampler(model, policy, order, n, layout=None, attention="auto"):
    streams = SequenceStreams(0, 0, B)
    chain = torch.arange(n).expand(B, n).clone() if order == "l2r" else \
        torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(100 + b)) for b in range(B)])
    runner = for_inference(model)
    if layout:
        runner = copy.copy(runner)
        runner.kernels = dataclasses.replace(runner.kernels, ragged=layout)
    teacher = torch.randint(model.config.vocab_size, (B, n), generator=torch.Generator().manual_seed(5))
    plan = step_counts(policy, "linear", n, n, B, streams)
    settings = GenerationSettings(attention=attention)
    return DecoderSampler(runner, chain, torch.empty(0, dtype=torch.long), plan, settings, teacher=teacher)


def steps(s):
    flat = s.ychain.view(-1)
    for step in s.steps:
        s._forward(flat, step)
        flat[step.dest] = s.teacher[step.chain_at]
        yield


def lockstep(factories):
    best = {k: float("inf") for k in factories}
    for _ in range(ROUNDS):
        live = {k: steps(f()) for k, f in factories.items()}
        spent = dict.fromkeys(factories, 0.0)
        count = dict.fromkeys(factories, 0)
        with torch.inference_mode():
            while live:
                for k in list(live):
                    t0 = time.thread_time()
                    try:
                        next(live[k])
                    except StopIteration:
                        del live[k]
                        continue
                    spent[k] += time.thread_time() - t0
                    count[k] += 1
        for k in factories:
            best[k] = min(best[k], spent[k] / count[k] * 1e3)
    return best


def main(out: str) -> None:
    torch.set_num_threads(1)
    n = 256
    result = {"load_before": os.getloadavg(), "cpu_class": capability.cpu_class(), "n": n, "batch": B, "rounds": ROUNDS,
              "threads": 1, "torch": torch.__version__, "ms_per_step": {}}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if not capability.usable_precision(dtype):
            continue
        ao = build_model("aogpt", DEFAULT_SIZE, n, torch.device("cpu"), 0).to(dtype)
        gpt = build_model("gpt", DEFAULT_SIZE, n, torch.device("cpu"), 0).to(dtype)
        f = {"gpt": lambda gpt=gpt: sampler(gpt, "count", "l2r", n),
             "aogpt-count": lambda ao=ao: sampler(ao, "count", "random", n)}
        for layout in ("buckets", "runs", "padded"):
            f[f"aogpt-{layout}"] = lambda layout=layout, ao=ao: sampler(ao, "bernoulli", "random", n, layout)
        for attention in ("sdpa", "explicit"):
            f[f"gpt-{attention}"] = lambda a=attention, gpt=gpt: sampler(gpt, "count", "l2r", n, attention=a)
            f[f"aogpt-runs-{attention}"] = lambda a=attention, ao=ao: sampler(ao, "bernoulli", "random", n, "runs", a)
        ms = lockstep(f)
        result["ms_per_step"][name] = {**ms, "choice": for_inference(ao).decode_choice.describe(),
                                       "over_gpt": {k: v / ms["gpt"] for k, v in ms.items()}}
    result["load_after"] = os.getloadavg()
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
