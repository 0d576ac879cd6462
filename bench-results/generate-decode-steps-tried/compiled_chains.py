"""The adaLN modulation and the QK-norm as one inductor kernel each (torch.compile, dynamic shapes)
against the eager operations the decode step runs, at a step's 11 rows of width 256 (4 heads of 64),
one thread: microseconds per call (the fastest of 9 repeats) and the seconds compiling took.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench-results/generate-decode-steps-tried/compiled_chains.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from aogpt import capability
from aogpt.backbone import rms_norm


def timed(f) -> float:
    best = float("inf")
    for _ in range(9):
        f()
        calls, t0 = 0, time.thread_time()
        while time.thread_time() - t0 < 0.03:
            f()
            calls += 1
        best = min(best, (time.thread_time() - t0) / calls)
    return best * 1e6


def modulate(x, shift, scale):
    return torch.addcmul(shift, F.rms_norm(x, (x.shape[-1],), None, 1e-5), scale)


def qknorm(qkv, w):
    qk = qkv[:, :2]
    qkv[:, :2] = F.rms_norm(qk, (qk.shape[-1],), None, 1e-5) * w
    return qkv


def main(out: str) -> None:
    torch.set_num_threads(1)
    load = os.getloadavg()
    x, sh, sc = torch.randn(11, 256), torch.randn(11, 256), torch.randn(11, 256)
    qkv, w = torch.randn(11, 3, 4, 64), torch.randn(2, 1, 64)
    t0 = time.time()
    cm, cq = torch.compile(modulate, dynamic=True), torch.compile(qknorm, dynamic=True)
    with torch.inference_mode():
        cm(x, sh, sc)
        cq(qkv.clone(), w)
        compile_s = time.time() - t0

        def eager_qk():
            rows = qkv.view(11, 3, 4, 64)
            torch.mul(rms_norm(rows[:, :2], None, 1e-5), w, out=rows[:, :2])

        res = {"cpu_class": capability.cpu_class(), "load_before": load, "compile_seconds": compile_s,
               "modulate_us": {"eager": timed(lambda: torch.addcmul(sh, rms_norm(x, None, 1e-5), sc)),
                               "compiled": timed(lambda: cm(x, sh, sc))},
               "qk_norm_us": {"eager": timed(eager_qk), "compiled": timed(lambda: cq(qkv, w))},
               "load_after": os.getloadavg(), "torch": torch.__version__}
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
