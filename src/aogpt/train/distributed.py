"""Parallelism, kept apart from the model and the training loop (torchtitan style).

`torchrun --nproc_per_node=N -m aogpt train ...` sets RANK/WORLD_SIZE/LOCAL_RANK; we then join a
process group (NCCL on CUDA, gloo on CPU) and wrap the model with DDP, or shard it with FSDP2's
`fully_shard`. Without those variables everything runs in one process with no wrapper at all.
"""

from __future__ import annotations

import datetime
import gc
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from aogpt.errors import AOGPTError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or bool(self.backend)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def process_info(device_kind: str) -> DistInfo:
    """The process torchrun's variables describe (a single process without them); joins nothing."""
    if not launched_by_torchrun():
        return DistInfo()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    backend = "nccl" if device_kind == "cuda" else "gloo"
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, backend=backend)


def join(info: DistInfo) -> None:
    """Join the process group `info` describes (nothing for a single process)."""
    if not info.backend:
        return
    if info.backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=info.backend, timeout=datetime.timedelta(minutes=30))


def init_distributed(device_kind: str) -> DistInfo:
    """Join the process group if torchrun started us; otherwise a single-process DistInfo."""
    info = process_info(device_kind)
    join(info)
    return info


T = TypeVar("T")


def shutdown() -> None:
    """Leave the process group without hanging.

    Gloo's backend stops its worker threads in its destructor and waits for them. A worker that has
    just finished a collective may still need the GIL, to free a tensor whose Python object it came to
    own (a barrier frees the earlier collectives' buffers when it is itself freed). When the group's
    last reference goes from C++ with the GIL held -- DDP's reducer, when the model outlives the
    group, or the group registry inside `destroy_process_group` -- the destructor waits for the
    worker and the worker for the GIL, forever: one rank hangs after the others have exited. So the
    model is freed first (the wrappers caught in reference cycles by `gc.collect`; `run_in_group`
    frees the caller's), and the last reference is this Python one, whose destructor releases the GIL
    while the threads stop."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    group = dist.group.WORLD
    gc.collect()  # a DDP wrapper kept alive only by a reference cycle lets go of the group now, not later
    dist.destroy_process_group()
    del group  # the last reference: its destructor releases the GIL while gloo's threads stop


def _forget_locals(exc: BaseException) -> None:
    """Clear the finished frames an exception's traceback keeps alive (and its causes'), so the model
    they hold is freed before the process group (`shutdown`); the traceback still prints."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def run_in_group(info: DistInfo, work: Callable[[], T]) -> T:
    """Join the process group `info` describes, run `work` (which builds, trains and drops the wrapped
    model) and leave the group (`shutdown`), also when `work` raises: nothing `work` made outlives the
    group, so its last reference goes where the GIL is released. A single process just runs `work`."""
    join(info)
    try:
        return work()
    except BaseException as exc:
        _forget_locals(exc)
        raise
    finally:
        shutdown()


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device, fsdp: bool,
               param_dtype: torch.dtype | None = None) -> nn.Module:
    """DDP (default) or FSDP2 `fully_shard` (per block, then the whole model). Under FSDP the
    parameters are gathered in `param_dtype` for compute (bf16 with autocast on CUDA; None keeps
    fp32, as on the CPU) and gradients reduced in fp32. FSDP2 runs on CPU processes too (gloo)."""
    if fsdp:
        if not (dist.is_available() and dist.is_initialized()):
            raise AOGPTError("FSDP shards the model over several processes", "launch with torchrun, or drop --fsdp")
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_flag(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every rank if it is true on any (used to stop all ranks together)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
