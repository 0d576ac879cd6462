"""Training pieces of a reproduction in several processes side by side (`aogpt reproduce --jobs N`).

The runs of `aogpt reproduce` are small (a 2-layer model on batches of 32 short windows): one process
cannot keep two cores busy with one run's matrix products, but two processes of one thread each,
each training its own run, can (docs/reproduce.md gives the measurement). `run_pieces` trains a
round's pieces (`aogpt.reproduce.runner.advance`: a run brought to a step, validated and
checkpointed) in a pool of N spawned worker processes, each with its own share of the threads.
The runner still goes round by round, so the runs stay interleaved, and every piece still ends in
a checkpoint, so nothing about resuming changes:

* a piece is the same computation in a worker as in the main process (same seeds, one thread each);
* Ctrl-C reaches every process of the terminal's group: a worker inside a piece finishes its step and
  checkpoints (the trainer's own handler); one between pieces remembers it and begins no other piece
  (one still setting its trainer up trains one step and checkpoints); the main process cancels the
  pieces not yet handed out, waits for the others, then reports the interruption as one process
  would. SIGTERM sent to the main process alone is passed on to the workers;
* a worker that dies (killed, out of memory) is a one-line error; the finished pieces are kept.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError

_DATA: Any = None  # the worker's prepared data (opened once)
_SIGNALLED: list[str] = []  # a stop signal that came between pieces


def _remember(signum: int, frame: Any) -> None:  # noqa: ARG001
    _SIGNALLED.append(signal.Signals(signum).name)


def _init_worker(data_dir: str, threads: int) -> None:
    """A worker: its threads, its signals (remembered between pieces), the data opened once."""
    global _DATA
    import torch

    from aogpt.data import PreparedData

    torch.set_num_threads(threads)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _remember)
    _DATA = PreparedData(data_dir)


def _piece(advance: Callable[..., int], run: Any, until: int) -> int:
    """One piece in a worker (`advance`: `aogpt.reproduce.runner.advance`, passed by reference): the
    steps trained (KeyboardInterrupt after a stop signal, checkpointed). A piece queued before a stop
    signal and taken after it is not begun."""
    if _SIGNALLED:
        raise KeyboardInterrupt
    return advance(run, until, _DATA, stop=lambda: bool(_SIGNALLED))


def threads_per_job(jobs: int, threads: int | None = None) -> int:
    """Each job's threads: this process's threads (torch's setting) shared out, at least one."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return max(1, threads // jobs)


@contextlib.contextmanager
def _forward_sigterm(pool: ProcessPoolExecutor) -> Iterator[None]:
    """While training: SIGTERM to this process is passed on to the workers and ends the wait here."""

    def handle(signum: int, frame: Any) -> None:  # noqa: ARG001
        for pid in list(getattr(pool, "_processes", {}) or {}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Pool:
    """N spawned workers, each training one piece at a time (`run_round`)."""

    def __init__(self, data_dir: Path, jobs: int, threads: int) -> None:
        self.jobs = jobs
        self.executor = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker, initargs=(str(data_dir), threads))

    def run_round(self, advance: Callable[..., int], pieces: Sequence[tuple[Any, int]],
                  done: Callable[[Any, int], None]) -> None:
        """Train every (run, until) of one round with `advance`; `done(run, steps)` as each piece ends.
        Raises KeyboardInterrupt after a stop signal, once every started piece has checkpointed."""
        futures: dict[Future, Any] = {self.executor.submit(_piece, advance, run, until): run for run, until in pieces}
        interrupted = False
        with _forward_sigterm(self.executor):
            pending = set(futures)
            while pending:
                try:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                except KeyboardInterrupt:
                    interrupted = True
                    for f in pending:
                        f.cancel()
                    continue
                for f in finished:
                    if f.cancelled():
                        continue
                    try:
                        done(futures[f], f.result())
                    except KeyboardInterrupt:
                        interrupted = True
                    except BrokenProcessPool:
                        if interrupted:  # a worker stopped before it could take the signal: nothing was lost
                            continue
                        raise AOGPTError("a training process of the reproduction died (killed, or out of memory)",
                                         "run the same command again to continue, with fewer --jobs") from None
        if interrupted:
            raise KeyboardInterrupt

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def cost(run: Any) -> float:
    """A piece's relative cost, to start the longest pieces of a round first: steps x context."""
    return run.train_cfg.max_steps * run.model_cfg.block_size * (1.3 if run.spec.order != "l2r" else 1.0)
