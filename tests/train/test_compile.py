"""`aogpt.compiling` and the compiled training step: when `auto` compiles, where the kernels are kept,
the refusal without a compiler, and a compiled step that trains like the eager one."""

from __future__ import annotations

import pytest
import torch

from aogpt import compiling
from aogpt.errors import AOGPTError
from tests.train.runs import make

CPU = torch.device("cpu")


def test_auto_compiles_a_single_process_run_where_it_pays_within_its_budget(monkeypatch):
    monkeypatch.setattr(compiling, "c_compiler", lambda: "/usr/bin/g++")
    for precision, share in compiling.COMPILED_STEP_SHARE.items():
        pays_from = compiling.COLD_COMPILE_SECONDS / (60 * (1 - share))  # minutes where the saving passes the cost
        assert compiling.decide_training("auto", CPU, max_minutes=pays_from * 1.05, precision=precision)[0]
        compiled, why = compiling.decide_training("auto", CPU, max_minutes=pays_from * 0.95, precision=precision)
        assert not compiled and f"costs about {compiling.COLD_COMPILE_SECONDS:.0f} s" in why
    assert compiling.decide_training("auto", CPU, max_minutes=60)[0]
    assert not compiling.decide_training("auto", CPU, max_minutes=0)[0]  # no budget: length unknown
    assert not compiling.decide_training("auto", CPU, max_minutes=2)[0]  # too short to pay back
    assert not compiling.decide_training("auto", CPU, max_minutes=10, world_size=2)[0]
    assert not compiling.decide_training("off", CPU, max_minutes=10)[0]
    assert compiling.decide_training(True, CPU, max_minutes=0)[0]  # the flag's old form: on
    with pytest.raises(AOGPTError, match="use --compile auto, on or off"):
        compiling.decide_training("sometimes", CPU, max_minutes=10)


def test_no_cpp_compiler_turns_auto_off_and_refuses_on(monkeypatch):
    monkeypatch.setattr(compiling, "c_compiler", lambda: None)
    compiled, why = compiling.decide_training("auto", CPU, max_minutes=60)
    assert not compiled and "no C++ compiler" in why
    with pytest.raises(AOGPTError, match="needs a C\\+\\+ compiler"):
        compiling.decide_training("on", CPU, max_minutes=10)


def test_kernels_are_kept_in_the_users_cache_not_torchs_temporary_default(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ours = tmp_path / "xdg" / "aogpt" / "inductor"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compiling.cache_dir() == ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor writes there itself
    assert compiling.cache_dir() == ours
    assert compiling.use_persistent_cache() == ours and ours.is_dir()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(ours)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own choice wins
    assert compiling.cache_dir() == tmp_path / "mine"


def test_a_compiled_training_step_trains_like_the_eager_one(tmp_path, monkeypatch):
    """fp32, tiny AO-GPT: the same losses and weights after three steps. The graph is captured as
    `aogpt train` captures it (dynamo, the model's compile-time formulas, AOT autograd's backward) and
    run by the `aot_eager` backend: inductor's C++ kernels are torch's own and take a minute to build,
    which `aogpt bench train --paths compiled` does on the real model."""
    import functools

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    eager = make(None, max_steps=3, dtype="float32", compile="off")
    compiled = make(None, max_steps=3, dtype="float32", compile="on")
    assert compiled.compiled and not eager.compiled
    assert compiled.warm_up() > 0 and compiled.warm_up() == 0.0  # compiled once, before the first step
    for _ in range(3):
        a, b = eager.train_step(), compiled.train_step()
        assert abs(a.loss - b.loss) < 1e-5 * max(1.0, abs(a.loss))
    for (name, p), q in zip(eager.raw.named_parameters(), compiled.raw.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
