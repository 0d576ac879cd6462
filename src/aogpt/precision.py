"""One precision vocabulary for every command and the library, and what `auto` means.

Every ``--dtype`` (train, eval, sample, bench) and every library argument takes the same names:
``auto``, ``fp32``/``float32``, ``bf16``/``bfloat16``, ``fp16``/``float16`` and, where it applies,
``fp64``/``float64``; output always prints the short form (`name_of`). Commands differ only in
which precisions apply to them (autocast has no fp64; evaluation has), never in their spelling.

What a precision means on the machine at hand is asked of `aogpt.capability`:

- ``auto`` for training (`auto_precision`): bf16 autocast on a CUDA GPU and on a CPU with bf16
  units (about 3.5x the fp32 matrix rate there), else fp32;
- an explicit bf16/fp16 on a CPU that cannot compute in it at a useful speed (an AVX2-only CPU:
  emulated about a hundred times slower) is refused with one line (`check_usable`); a precision the
  CPU converts rather than computes natively is accepted and said so.
"""

from __future__ import annotations

import argparse

import torch

from aogpt import capability
from aogpt.errors import AOGPTError

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                                  "fp64": torch.float64}
LONG_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
ALIASES = {**{short: short for short in DTYPES}, **{long: short for short, long in LONG_NAMES.items()}}
NAMES = ("auto", *ALIASES)  # every accepted spelling
AUTOCAST = ("auto", "fp32", "bf16", "fp16")  # training and benchmarks of it: autocast has no fp64
WEIGHTS = ("auto", "fp32", "bf16", "fp16", "fp64")  # a model's weights (evaluation, sampling)


def spelling(allowed: tuple[str, ...]) -> str:
    """``auto, fp32 (float32), bf16 (bfloat16)``: the names a command accepts, both spellings."""
    return ", ".join(name if name == "auto" else f"{name} ({LONG_NAMES[name]})" for name in allowed)


def canonical(name: str | torch.dtype | None, allowed: tuple[str, ...] = WEIGHTS) -> str:
    """The short name (``auto``, ``fp32``, ``bf16``, ``fp16``, ``fp64``) of any spelling or dtype;
    None is fp32. Refused with one line when unknown or not among `allowed`."""
    if name is None:
        short = "fp32"
    elif isinstance(name, torch.dtype):
        short = next((k for k, v in DTYPES.items() if v == name), str(name))
    else:
        short = ALIASES.get(name.strip().lower(), name.strip().lower()) if name.strip().lower() != "auto" else "auto"
    if short not in allowed:
        raise AOGPTError(f"unknown precision {str(name)!r}" if short not in ("auto", *DTYPES) else
                         f"precision {short} does not apply here", f"use {spelling(allowed)}")
    return short


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a precision name (not ``auto``)."""
    if isinstance(name, torch.dtype):
        return name
    return DTYPES[canonical(name, tuple(DTYPES))]


def name_of(dtype: torch.dtype | None) -> str:
    """How a precision is printed: ``fp32`` (also for None: no autocast), ``bf16``, ``fp16``, ``fp64``."""
    return canonical(dtype, tuple(DTYPES))


def precision_arg(allowed: tuple[str, ...] = WEIGHTS):
    """An argparse type: any spelling of an allowed precision, returned in its short form."""
    def parse(text: str) -> str:
        try:
            return canonical(text, allowed)
        except AOGPTError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "precision"
    return parse


def parse_list(spec: str | list[str] | tuple[str, ...] | None, allowed: tuple[str, ...] = AUTOCAST,
               default: str = "auto") -> list[str]:
    """``fp32,bf16`` or a list: short names, in order, without repeats."""
    names = [d for d in (spec.split(",") if isinstance(spec, str) else list(spec or [default])) if str(d).strip()]
    if not names:
        raise AOGPTError("no precision given", f"use {spelling(allowed)}")
    return list(dict.fromkeys(canonical(str(d), allowed) for d in names))


def _cpu_lacks(dtype: torch.dtype) -> str:
    c = capability.cpu()
    units = "bf16" if dtype == torch.bfloat16 else "fp16"
    return (f"this CPU ({c.cpu_class}) has no {units} units, so {name_of(dtype)} would be emulated, far slower "
            "than fp32")


def check_usable(dtype: torch.dtype | None, device: torch.device | str) -> None:
    """Refuse an explicitly asked precision the device cannot compute in at a useful speed."""
    dev = torch.device(device)
    if dtype is None or dtype in (torch.float32, torch.float64) or dev.type != "cpu":
        return
    if not capability.usable_precision(dtype):
        raise AOGPTError(_cpu_lacks(dtype), "use fp32, or auto to let aogpt choose")


def usable_only(names: list[str], device: torch.device | str) -> tuple[list[str], list[str]]:
    """The precisions of `names` (short names, ``auto`` among them) the device computes in, and a note
    for each one left out; refused with one line when none is left. Benchmarks that time several
    precisions side by side skip the ones this CPU cannot run instead of failing the whole run."""
    kept, notes = [], []
    for name in names:
        dtype = DTYPES.get(name)
        if name == "auto" or dtype is None or torch.device(device).type != "cpu" or capability.usable_precision(dtype):
            kept.append(name)
        else:
            notes.append(f"{name} skipped: {_cpu_lacks(dtype)}")
    if not kept:
        raise AOGPTError("; ".join(notes), "use fp32, or auto to let aogpt choose")
    return kept, notes


def usable_note(dtype: torch.dtype | None, device: torch.device | str) -> str:
    """'' where `dtype` runs natively, else a clause saying it is converted (usable, not faster)."""
    dev = torch.device(device)
    if dtype is None or dev.type != "cpu" or capability.native_precision(dtype):
        return ""
    return f"; this CPU ({capability.cpu_class()}) converts {name_of(dtype)} rather than multiplying it natively"


def auto_precision(device: torch.device | str) -> tuple[torch.dtype | None, str]:
    """What `auto` computes in on `device` (autocast dtype or None for fp32, why): bf16 on CUDA and on
    a CPU with bf16 units, where a matrix product runs several times faster than in fp32 (measured on
    this project's machines: 246 vs 71 GFLOP/s on an AMD EPYC with avx512_bf16, 1.5 T vs 0.2 T on an
    Intel Xeon with AMX); elsewhere bf16 is converted or emulated and no faster, so fp32. Autocast keeps
    fp32 master weights and optimizer state; draws stay in float64."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.bfloat16, "bf16 autocast (auto: a CUDA GPU)"
    if dev.type == "cpu":
        cls = capability.cpu_class()
        if capability.native_precision(torch.bfloat16):
            return torch.bfloat16, f"bf16 autocast (auto: this CPU, {cls}, has bf16 units)"
        return None, f"fp32 (auto: this CPU, {cls}, has no bf16 units)"
    return None, f"fp32 (auto: no bf16 default on {dev.type})"


def resolve_precision(name: str | torch.dtype | None, device: torch.device | str,
                      allowed: tuple[str, ...] = AUTOCAST) -> tuple[torch.dtype | None, str]:
    """(compute dtype or None for fp32, a line saying which and why) for a precision name: `auto`
    (`auto_precision`) or an explicit one (refused where the device cannot compute in it)."""
    short = canonical(name, allowed)
    if short == "auto":
        return auto_precision(device)
    dtype = DTYPES[short]
    if dtype == torch.float32:
        return None, "fp32 (asked for)"
    check_usable(dtype, device)
    kind = "autocast" if dtype in (torch.bfloat16, torch.float16) else "weights"
    return dtype, f"{short} {kind} (asked for{usable_note(dtype, device)})"


def weights_precision(name: str | torch.dtype | None, device: torch.device | str) -> tuple[torch.dtype, str]:
    """(the dtype to hold a model's weights in, why) for evaluation: `auto` is bf16 where native,
    else fp32; an explicit precision is checked like `resolve_precision`'s."""
    dtype, why = resolve_precision(name, device, WEIGHTS)
    return (dtype or torch.float32), why.replace(" autocast", " weights")


__all__ = ["ALIASES", "AUTOCAST", "DTYPES", "NAMES", "WEIGHTS", "auto_precision", "canonical", "check_usable",
           "name_of", "parse_list", "precision_arg", "resolve_precision", "spelling", "to_dtype", "usable_note",
           "usable_only",
           "weights_precision"]
