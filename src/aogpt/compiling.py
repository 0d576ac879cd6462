"""torch.compile in aogpt: when it is used (``--compile auto|on|off``), where its cache lives, and the
checks that turn a missing compiler into one clear line instead of a traceback mid-run.

On the CPU, inductor writes C++ for the fused elementwise work and builds it with the system's C++
compiler (g++ here); the matrix products stay oneDNN's. For AO-GPT's training step that removes most
of the elementwise passes around adaLN, the norms and attention's softmax (docs/benchmarks.md has
the figures). Compiling costs tens of seconds the first time; the kernels are cached on disk
(`cache_dir`, kept across runs and reboots), so the next run of the same model on the same machine
pays a few seconds. A compiled function is specialised to its shapes and to the thread count:
training compiles once (fixed batch and block; the curriculum's stages change the orders' values,
not the shapes) and never recompiles.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from aogpt.capability import COMPILERS, c_compiler
from aogpt.errors import AOGPTError

CHOICES = ("auto", "on", "off")
AUTO_MIN_MINUTES = 5.0  # on CUDA, `auto` compiles a run with a time budget of at least this
# On the CPU, `auto` compiles a time-budgeted run where compiling saves more time than it costs: the
# compiled training step's time over the eager one's, per precision, and the seconds a first (cold)
# compile takes, measured on this project's CPU classes (docs/cpu.md, "Compiling where it pays").
COMPILED_STEP_SHARE = {"bf16": 0.63, "fp16": 0.63, "fp32": 0.85}  # AMX bf16 0.57-0.63; AVX2 fp32 0.79-0.91
COLD_COMPILE_SECONDS = 45.0  # the quickstart's first compile: 34 s (AMD EPYC, bf16) to 57 s (AVX2 EPYC, fp32)


def normalize_choice(value: str | bool) -> str:
    """`auto`, `on` or `off`; True/False (the flag's old form, in older run configs) mean on/off."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value not in CHOICES:
        raise AOGPTError(f"unknown compile setting {value!r}", "use --compile auto, on or off")
    return value


def cache_dir() -> Path:
    """Where compiled kernels are kept between runs: $TORCHINDUCTOR_CACHE_DIR if the user set it, else
    ~/.cache/aogpt/inductor ($XDG_CACHE_HOME respected). Inductor writes its own default (a folder in
    /tmp, lost on reboot) into that variable the first time it looks, so that value is not the user's."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(_torch_default_cache_dir()):
        return Path(chosen)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aogpt" / "inductor"


def _torch_default_cache_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch layout: no default of torch's to tell apart
        return ""
    return default_cache_dir()


def use_persistent_cache() -> Path:
    """Point inductor's on-disk caches at `cache_dir` (torch's default lives in /tmp and is lost on
    reboot); returns it."""
    path = cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)  # the user's own choice is `path` itself (cache_dir)
    # tracing a norm whose input is bf16 (autocast) and weight float32 warns once per graph; the
    # compiled kernel handles the mix itself
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    return path


def check_compiler(device: torch.device) -> None:
    """Refuse `--compile on` where it cannot work: no C++ compiler for CPU kernels, or MPS."""
    if device.type == "mps":
        raise AOGPTError("torch.compile is not supported on MPS here", "pass --compile off")
    if device.type == "cpu" and c_compiler() is None:
        raise AOGPTError(f"torch.compile on the CPU needs a C++ compiler, and none was found ({', '.join(COMPILERS)})",
                         "install one (e.g. apt-get install g++), or pass --compile off")


def compile_pays(max_minutes: float, precision: str) -> tuple[bool, str]:
    """Whether compiling a CPU run of `max_minutes` in `precision` (fp32, bf16) saves more than it
    costs, and the figures that decide it in words."""
    share = COMPILED_STEP_SHARE.get(precision, 1.0)
    saved = max_minutes * 60.0 * (1 - share)
    pays = saved > COLD_COMPILE_SECONDS
    return pays, (f"compiling costs about {COLD_COMPILE_SECONDS:.0f} s the first time and saves about {saved:.0f} s "
                  f"of a {max_minutes:g}-minute {precision} run ({100 * (1 - share):.0f}% a step)")


def decide_training(choice: str | bool, device: torch.device, *, max_minutes: float, world_size: int = 1,
                    fsdp: bool = False, precision: str = "fp32") -> tuple[bool, str]:
    """(compile the training step?, why, in words for the plan line). `auto` compiles a single-process
    run under a time budget: on the CPU (with a C++ compiler) where it pays within the budget
    (`compile_pays`, by the run's `precision`), on CUDA from `AUTO_MIN_MINUTES`. The decision depends
    on the configuration only, so a resumed run decides as the original did."""
    choice = normalize_choice(choice)
    if choice == "off":
        return False, "off (--compile off)"
    if choice == "on":
        check_compiler(device)
        return True, "on (--compile on)"
    if device.type not in ("cpu", "cuda"):
        return False, f"off (auto: not used on {device.type})"
    if device.type == "cpu" and c_compiler() is None:
        return False, "off (auto: no C++ compiler found; install g++ to compile)"
    if fsdp or world_size > 1:
        return False, "off (auto: not used with several processes; --compile on to try)"
    if max_minutes <= 0:  # without a time budget the run's length is unknown before it starts
        return False, "off (auto: compiled only under a time budget, --max-minutes; --compile on to compile)"
    if device.type == "cpu":
        pays, figures = compile_pays(max_minutes, precision)
        if not pays:
            return False, f"off (auto: {figures}; --compile on to compile)"
        return True, f"on (auto: {figures}; the compile time is counted in the budget)"
    if max_minutes < AUTO_MIN_MINUTES:
        return False, (f"off (auto: compiled only under a time budget of at least {AUTO_MIN_MINUTES:g} minutes; "
                       "--compile on to compile)")
    return True, f"on (auto: a {max_minutes:g}-minute budget; the compile time is counted in it)"
