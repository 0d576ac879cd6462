"""`aogpt bench gpu`: DDP and FSDP2 under torchrun, against the same steps in one process.

`run` launches ``python3 -m torch.distributed.run --standalone --nproc_per_node N -m
aogpt.bench.gpu.distributed SPEC OUT`` (this module's `main`, with this package's source folder on
PYTHONPATH): every rank trains a few steps with DDP, then with FSDP2 (`fully_shard`), in fp32 and
under bf16 autocast, on random tokens; rank 0 writes the losses. The same steps then run in this
process without torchrun, with N micro-batches accumulated where N ranks each take one (the global
batch is the same, `aogpt.train.step`), and every loss must agree: fp32 tightly, bf16 within its
rounding (FSDP2 casts the weights to bf16 before the forward where autocast casts them per product).
N is 1, then every visible GPU when there are several. On the CPU (``--quick``) the ranks use gloo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from aogpt.bench.gpu.parts import NO_CUDA, Context
from aogpt.precision import to_dtype

WORKER = "aogpt.bench.gpu.distributed"
MODES = ("ddp", "fsdp")
TOL_LOSS = {"fp32": 1e-4, "bf16": 1e-2}  # relative, per step


def run(ctx: Context) -> None:
    p = ctx.plan
    count = torch.cuda.device_count() if ctx.cuda else 1
    worlds = [1] + ([count] if count > 1 else [])
    dtypes = list(p.dist_dtypes)
    if not ctx.cuda:  # a CPU without bf16 (AVX2) is refused it: the fp32 runs still check the code paths
        from aogpt import capability

        for d in [d for d in dtypes if d != "fp32" and not capability.usable_precision(to_dtype(d))]:
            ctx.skip(f"DDP and FSDP2, {d}", f"this CPU ({capability.cpu_class()}) has no {d} units")
            dtypes.remove(d)
    if count == 1:
        ctx.skip("distributed over every visible GPU", "one GPU visible" if ctx.cuda else NO_CUDA)
    for world in worlds:
        spec = {"size": list(p.dist_size.to_dict().values()), "block": p.dist_block, "batch": p.dist_batch,
                "steps": p.dist_steps, "dtypes": dtypes, "device": "cuda" if ctx.cuda else "cpu",
                "seed": ctx.seed, "accum": 1, "threads": 1 if not ctx.cuda else None}
        # on the GPU the part's share is a hard end; on a CPU (--quick, under a test suite's load) a margin
        ranks = _launch(spec, world, timeout=max(5.0, ctx.left()) if ctx.cuda else max(60.0, ctx.left() + 60.0))
        procs = f"{world} process{'es' if world > 1 else ''}"
        ctx.progress(f"{procs}: torchrun finished")
        reference = {d: train_losses({**spec, "accum": world}, d, fsdp=False) for d in dtypes}
        for mode in MODES:
            for d in dtypes:
                name = f"{'DDP' if mode == 'ddp' else 'FSDP2'}, {procs}, {d}: loss per step = one process's"
                got = ranks.get(f"{mode}/{d}")
                if not isinstance(got, list):
                    ctx.verdict(name, False, note=str(got))
                    continue
                error = max(abs(a - b) / abs(b) for a, b in zip(got, reference[d], strict=True))
                ctx.check(name, error, TOL_LOSS[d], note=f"relative; {', '.join(f'{x:.5f}' for x in got)} vs "
                          f"{', '.join(f'{x:.5f}' for x in reference[d])}")
        ctx.metric(f"world_{world}", {"ranks": ranks, "one_process": reference})
        ctx.save()
    size = p.dist_size
    ctx.lines(f"{size.n_layer} layers, width {size.n_embd}, {size.n_head} heads, vocabulary {size.vocab_size:,}; "
              f"{p.dist_steps} steps of batch {p.dist_batch} x {p.dist_block} per process; tolerances (relative, per "
              f"step): fp32 {TOL_LOSS['fp32']:g}, bf16 {TOL_LOSS['bf16']:g}.")


def _launch(spec: dict[str, Any], world: int, timeout: float) -> dict[str, Any]:
    """Run the worker under torchrun with `world` processes; the losses rank 0 wrote."""
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the aogpt package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory(prefix="aogpt-gpu-dist-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "losses.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               "-m", WORKER, str(spec_path), str(out_path)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # its own group: a timeout ends the ranks too
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            raise RuntimeError(f"torchrun with {world} processes did not finish in {timeout:.0f} s") from None
        except BaseException:  # this process is being stopped: the ranks go with it
            _end(proc)
            raise
        if proc.returncode != 0 or not out_path.is_file():
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise RuntimeError(f"torchrun with {world} processes exited with {proc.returncode}: {tail}")
        return json.loads(out_path.read_text(encoding="utf-8"))


def _end(proc: subprocess.Popen) -> None:
    """End torchrun and its ranks (their own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def train_losses(spec: dict[str, Any], precision: str, *, fsdp: bool, info: Any = None) -> list[float]:
    """The losses of `spec["steps"]` optimizer steps from the seed, in `precision`, with DDP or FSDP2
    under torchrun (`info`) or in one process (`info` None: `spec["accum"]` micro-batches a step)."""
    from aogpt.bench.common import Size
    from aogpt.config import train_config
    from aogpt.train import RandomTokens, Trainer

    size = Size(*spec["size"])
    tcfg = train_config(None, "aogpt", batch_size=spec["batch"], grad_accum=spec["accum"], max_steps=10 ** 6,
                        warmup_steps=0, eval_interval=10 ** 6, ckpt_interval=10 ** 6, device=spec["device"],
                        seed=spec["seed"], dtype=precision, compile="off", fsdp=fsdp)
    trainer = Trainer(size.config("aogpt", spec["block"]), tcfg, RandomTokens(size.vocab_size), None, info=info,
                      show_progress=False)
    return [trainer.train_step().loss for _ in range(spec["steps"])]


def main(argv: list[str] | None = None) -> int:
    """One rank of the torchrun launch: SPEC OUT (JSON files); rank 0 writes the losses to OUT."""
    from aogpt.train import distributed

    spec_path, out_path = (Path(a) for a in (argv if argv is not None else sys.argv[1:]))
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    info = distributed.init_distributed(spec["device"])
    results: dict[str, Any] = {}
    try:
        for mode in MODES:
            for precision in spec["dtypes"]:
                try:
                    results[f"{mode}/{precision}"] = train_losses(spec, precision, fsdp=mode == "fsdp", info=info)
                except Exception as exc:  # noqa: BLE001 - reported by the parent, the other modes still run
                    results[f"{mode}/{precision}"] = f"{type(exc).__name__}: {exc}"
        if info.is_main:
            out_path.write_text(json.dumps(results), encoding="utf-8")
    finally:
        distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
