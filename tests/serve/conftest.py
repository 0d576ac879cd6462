"""Fixtures of the serving tests: models, an engine, and a real server on the loopback interface."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from aogpt.config import model_config
from aogpt.model import Transformer


def random_float32(n_layer: int = 2, n_head: int = 2, n_embd: int = 32, block_size: int = 32, vocab: int = 64,
                   seed: int = 0, variant: str = "aogpt") -> Transformer:
    """A float32 model with every weight random (adaLN too, so the target position matters): the CPU
    decode path then runs on oneDNN's packed weights, as a served checkpoint's does."""
    torch.manual_seed(seed)
    extra = {"target_dim": 16} if variant == "aogpt" else {}
    model = Transformer(model_config(variant, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                                     vocab_size=vocab, **extra))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN" in name:
                p.normal_(0.0, 0.05)
    return model.eval().requires_grad_(False)


def slow_loaded() -> SimpleNamespace:
    """A random model of the quickstart's size with the bytes tokenizer: long enough requests to
    interrupt (about a second for 128 positions one per step), and room for every prompt of the
    mixed load (`aogpt.bench.serve.load`)."""
    from aogpt.data.tokenizer import ByteTokenizer

    return SimpleNamespace(model=random_float32(n_layer=4, n_head=3, n_embd=192, block_size=128, vocab=320, seed=3),
                           tokenizer=ByteTokenizer())


def save_run(loaded: Any, run: Path) -> Path:
    """A model and its (bytes) tokenizer saved as run directory `run` (one checkpoint, EMA = raw)."""
    from aogpt.checkpoint import save_checkpoint
    from aogpt.config import to_dict

    save_checkpoint(run / "ckpt-0000001", loaded.model, config={"model": to_dict(loaded.model.config),
                                                               "tokenizer": "bytes", "step": 1},
                    tokenizer=loaded.tokenizer, ema={k: v.clone() for k, v in loaded.model.state_dict().items()})
    return run


@pytest.fixture(scope="session")
def slow_checkpoint(tmp_path_factory) -> Path:
    """`slow_loaded` saved as a run directory that `aogpt serve --checkpoint` takes."""
    return save_run(slow_loaded(), tmp_path_factory.mktemp("serve") / "slow")


def start_server(checkpoint: Path, *flags: str, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE
                 ) -> subprocess.Popen:
    """`aogpt serve` in a process of its own on a free loopback port (one torch thread)."""
    return subprocess.Popen([sys.executable, "-m", "aogpt", "serve", "--checkpoint", str(checkpoint), "--port", "0",
                             *flags], stdout=stdout, stderr=stderr, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="session")
def quickstart_sized() -> Transformer:
    """A random AO-GPT of the quickstart's size (4 layers, width 192, context 128, 512 tokens)."""
    return random_float32(n_layer=4, n_head=3, n_embd=192, block_size=128, vocab=512, seed=1)


@dataclass
class Running:
    url: str
    engine: Any
    loaded: Any
    name: str


class ThreadServer:
    """uvicorn serving `app` from a thread of this process, on a free loopback port."""

    def __init__(self, app: Any):
        import uvicorn

        from aogpt.cli.serve import bind

        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def serve(loaded: Any, name: str = "tiny", max_samples: int = 16, **limits: Any) -> Iterator[Running]:
    from aogpt.serve import Engine, EngineLimits
    from aogpt.serve.app import create_app

    engine = Engine(loaded.model, EngineLimits(**limits))
    with ThreadServer(create_app(engine, loaded.tokenizer, name, max_samples=max_samples)) as srv:
        yield Running(f"http://127.0.0.1:{srv.port}", engine, loaded, name)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_run):
    import aogpt

    return aogpt.load(tiny_run)


@pytest.fixture(scope="module")
def server(tiny_loaded) -> Iterator[Running]:
    """A server on the tiny trained run (bytes tokenizer, context 32) with the default limits."""
    yield from serve(tiny_loaded)
