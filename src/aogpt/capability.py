"""What this CPU can do, asked once per process: the one place the project decides by instruction set.

Users run aogpt on every class of CPU: most laptops and many cloud cores have AVX2 and nothing newer;
some servers add AVX-512, bf16 dot-product units (`avx512_bf16`) or AMX tile units; ARM64 machines
(Apple silicon, Graviton) have NEON and sometimes bf16. What differs between them is not only speed:
on an AVX2-only CPU, oneDNN refuses to pack a bf16 weight ("bf16 path needs the cpu support
avx_ne_convert or avx512bw, avx512vl and avx512dq") and a bf16 matrix product is emulated about a
hundred times slower than fp32. So every path that depends on the instruction set asks here:

- `cpu_class()`: the class (``avx2``, ``avx512``, ``avx512-bf16``, ``amx``, ``arm64``, ``arm64-bf16``,
  ``x86-64``), named beside every figure the project prints;
- `native_precision(dtype)`: whether the CPU multiplies in that precision with its own units (bf16
  autocast by default, the generation precision probe);
- `usable_precision(dtype)`: whether it computes in it at a useful speed at all (an explicit request
  for one it cannot is refused, `aogpt.precision`);
- `can_pack(dtype)`: whether oneDNN packs a weight of that dtype (the decode path's packed linear
  layers, `aogpt.inference`), found by trying it once;
- `c_compiler()`: the C++ compiler `torch.compile` builds CPU kernels with.

**The lesser-CPU switch.** ``AOGPT_CPU=avx2`` (or ``avx512``, ``avx512-bf16``; ``native`` is the
default) makes a machine behave as a lesser one: the project's own answers above are those of that
class, and, when it is set before torch starts, PyTorch's own kernels are limited too
(`EMULATION`: ``ATEN_CPU_CAPABILITY`` for ATen's vectorised kernels, ``ONEDNN_MAX_CPU_ISA`` for
oneDNN's matrix products and weight packing, ``MKL_ENABLE_INSTRUCTIONS`` for MKL's fp32 products).
Variables the user set themselves are left alone. `emulation_gaps()` says which of those limits did
not take effect (torch imported before the switch, say). A switch above what the CPU has is refused.

Probes run lazily, at most once per process per question, and never print.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aogpt.errors import AOGPTError

SWITCH_ENV = "AOGPT_CPU"
CPUINFO = "/proc/cpuinfo"

# x86 classes from least to most capable, with the flags each one adds; a class has its own flags
# and those of every class before it.
X86_CLASSES: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "avx2": ("avx2", "avx", "fma", "f16c"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vbmi"),
    "avx512-bf16": ("avx512_bf16", "avx512_fp16", "avx_vnni"),
    "amx": ("amx_bf16", "amx_tile", "amx_int8", "amx_fp16"),
}
ARM_CLASSES: dict[str, tuple[str, ...]] = {
    "arm64": ("asimd", "fphp", "asimdhp"),
    "arm64-bf16": ("bf16", "i8mm", "sve", "sve2"),
}
# What each switch value tells PyTorch (set before torch starts; the user's own settings win).
EMULATION: dict[str, dict[str, str]] = {
    "x86-64": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "amx": {},
    "arm64": {"ATEN_CPU_CAPABILITY": "default"},
    "arm64-bf16": {},
}
# Flags that say a precision is multiplied natively (dot-product or matrix units), by architecture.
NATIVE_FLAGS = {"bfloat16": {"x86": ("avx512_bf16", "amx_bf16"), "arm": ("bf16",)},
                "float16": {"x86": ("avx512_fp16", "amx_fp16"), "arm": ("fphp", "asimdhp")}}


def _arch() -> str:
    machine = platform.machine().lower()
    return "arm" if machine in ("arm64", "aarch64") or machine.startswith("armv8") else "x86"


def _classes(arch: str) -> dict[str, tuple[str, ...]]:
    return ARM_CLASSES if arch == "arm" else X86_CLASSES


@functools.cache
def read_cpu(cpuinfo: str = CPUINFO) -> tuple[str, frozenset[str]]:
    """(model name, feature flags) as the operating system reports them: Linux's /proc/cpuinfo
    (``flags`` on x86, ``Features`` on ARM), macOS's sysctl; ("", {}) where neither says."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not name:
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    if not text and sys.platform == "darwin":
        name, flags = _darwin_cpu()
    return name, flags


def _darwin_cpu() -> tuple[str, frozenset[str]]:
    import subprocess

    def sysctl(key: str) -> str:
        try:
            return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    flags = {"asimd", "fphp", "asimdhp"} if platform.machine() == "arm64" else set()
    if sysctl("hw.optional.arm.FEAT_BF16") == "1":
        flags.add("bf16")
    return sysctl("machdep.cpu.brand_string"), frozenset(flags)


def class_of(flags: frozenset[str] | set[str], arch: str) -> str:
    """The most capable class whose flags (and every lesser class's) the CPU has."""
    classes = _classes(arch)
    best = next(iter(classes))
    for name, added in classes.items():
        # the defining flag of each class (its first) must be there; the rest are optional extras
        if added and added[0] not in flags:
            break
        best = name
    return best


def flags_of_class(name: str, arch: str) -> frozenset[str]:
    """Every flag a class may have: its own and those of the lesser classes."""
    out: set[str] = set()
    for cls, added in _classes(arch).items():
        out.update(added)
        if cls == name:
            return frozenset(out)
    raise KeyError(name)


def switch_value() -> str | None:
    """The lesser-CPU switch as set (lower case), None when unset or ``native``."""
    value = os.environ.get(SWITCH_ENV, "").strip().lower()
    return None if value in ("", "native") else value


def apply_switch() -> dict[str, str]:
    """Set PyTorch's own limits for the switch's class (`EMULATION`), leaving variables the user set;
    returns those set here. Called by ``import aogpt``, so the `aogpt` command applies it before torch
    starts; it does nothing (and raises nothing) for an unknown value: `capabilities` refuses it."""
    value = switch_value()
    if value is None:
        return {}
    set_here = {}
    for key, val in EMULATION.get(value, {}).items():
        if key not in os.environ:
            os.environ[key] = val
            set_here[key] = val
    return set_here


@dataclass(frozen=True)
class CPU:
    """The machine as the project sees it (after the switch); probes are answered by methods."""

    name: str  # the processor's model name
    arch: str  # x86 or arm
    native_class: str  # what the CPU itself is
    cpu_class: str  # what the project treats it as (the switch's class, or native_class)
    flags: frozenset[str] = field(repr=False)  # the CPU's flags, limited to cpu_class's

    @property
    def emulated(self) -> bool:
        return self.cpu_class != self.native_class

    def has_native(self, precision: str) -> bool:
        return any(f in self.flags for f in NATIVE_FLAGS[precision][self.arch])

    def describe(self) -> str:
        """`avx2 (AOGPT_CPU on an amx CPU, Intel Xeon Processor)` / `amx (Intel Xeon Processor)`."""
        where = f"{SWITCH_ENV}={self.cpu_class} on an {self.native_class} CPU, " if self.emulated else ""
        return f"{self.cpu_class} ({where}{self.name or platform.machine()})"


@functools.cache
def cpu() -> CPU:
    """This CPU, with the switch applied (cached for the process; `refresh` forgets)."""
    arch = _arch()
    name, flags = read_cpu()
    native = class_of(flags, arch)
    chosen = switch_value() or native
    classes = list(_classes(arch))
    if chosen not in classes:
        raise AOGPTError(f"{SWITCH_ENV}={chosen} is not a CPU class of this {platform.machine()} machine",
                         f"use one of: native, {', '.join(classes)}")
    if classes.index(chosen) > classes.index(native):
        raise AOGPTError(f"{SWITCH_ENV}={chosen} asks for more than this CPU has (it is {native})",
                         f"use a lesser class ({', '.join(classes[:classes.index(native) + 1])}) or unset it")
    return CPU(name=name, arch=arch, native_class=native, cpu_class=chosen,
               flags=frozenset(flags & flags_of_class(chosen, arch)))


def cpu_class() -> str:
    return cpu().cpu_class


def describe() -> str:
    """The CPU class as printed beside figures, with torch's kernel level and threads."""
    import torch

    return f"CPU {cpu().describe()}, torch kernels {torch.backends.cpu.get_cpu_capability()}"


def _dtype_name(dtype: Any) -> str:
    import torch

    names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
             torch.float64: "float64"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


@functools.cache
def _onednn_supports(precision: str) -> bool:
    """Whether oneDNN (as limited by ONEDNN_MAX_CPU_ISA) runs products in `precision` (torch's own check)."""
    import torch

    ops = getattr(torch.ops, "mkldnn", None)
    check = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}.get(precision)
    if not torch.backends.mkldnn.is_available() or ops is None or check is None or not hasattr(ops, check):
        return False
    try:
        return bool(getattr(ops, check)())
    except RuntimeError:
        return False


def native_precision(dtype: Any) -> bool:
    """Whether this CPU multiplies `dtype` with its own units (float32/float64 always; bf16 and fp16
    only with the units `NATIVE_FLAGS` names, and on x86 only where oneDNN will use them)."""
    precision = _dtype_name(dtype)
    if precision in ("float32", "float64"):
        return True
    if precision not in NATIVE_FLAGS:
        return False
    c = cpu()
    if not c.has_native(precision):
        return False
    return c.arch == "arm" or _onednn_supports(precision)


def usable_precision(dtype: Any) -> bool:
    """Whether this CPU computes in `dtype` at a useful speed: natively, or (x86) through oneDNN's
    conversions on AVX-512. False on an AVX2-only CPU, where bf16/fp16 products are emulated element
    by element (measured: 2 GFLOP/s against fp32's 100+)."""
    precision = _dtype_name(dtype)
    if native_precision(dtype):
        return True
    c = cpu()
    if precision == "bfloat16" and c.arch == "x86":
        return c.cpu_class not in ("x86-64", "avx2") and _onednn_supports(precision)
    return False


@functools.cache
def _pack_probe(precision: str) -> bool:
    import torch

    ops = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and ops is not None and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(precision)
    if dtype is None:
        return False
    try:  # a tiny weight: the refusal comes from the ISA check, before any work
        weight = torch.ones(8, 8, dtype=dtype)
        packed = ops._reorder_linear_weight(weight, 2)
        out = ops._linear_pointwise(torch.ones(2, 8, dtype=dtype), packed, None, "none", [], "")
        return bool(torch.equal(out.float(), torch.full((2, 8), 8.0)))
    except RuntimeError:
        return False


def can_pack(dtype: Any) -> bool:
    """Whether the decode path may pack a weight of `dtype` with oneDNN: tried once per process, and
    for bf16 only where the class allows it (under the switch, a lesser class never packs bf16 even if
    torch's own limit did not take effect)."""
    precision = _dtype_name(dtype)
    if precision == "bfloat16" and not usable_precision(dtype):
        return False
    return _pack_probe(precision)


COMPILERS = ("g++", "c++", "clang++")


def c_compiler() -> str | None:
    """The C++ compiler inductor builds CPU kernels with ($CXX first), or None if none is found."""
    for name in ((os.environ["CXX"],) if os.environ.get("CXX") else ()) + COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def emulation_gaps() -> list[str]:
    """Under the switch, the PyTorch limits that did not take effect (empty when all did, or no switch):
    ATen's kernel level, and oneDNN's bf16 refusal on classes without bf16."""
    import torch

    c = cpu()
    if not c.emulated:
        return []
    gaps = []
    want = EMULATION.get(c.cpu_class, {}).get("ATEN_CPU_CAPABILITY")
    have = torch.backends.cpu.get_cpu_capability()
    if want and have.lower() != want.lower():
        gaps.append(f"torch's kernels run {have}, not {want.upper()} (set {SWITCH_ENV} before Python starts)")
    if c.cpu_class in ("x86-64", "avx2") and _pack_probe("bfloat16"):
        gaps.append("oneDNN still packs bf16 weights (set ONEDNN_MAX_CPU_ISA=AVX2 before Python starts)")
    return gaps


def summary() -> dict[str, Any]:
    """What the project knows about this CPU, for reports and `--json`."""
    import torch

    c = cpu()
    return {"cpu_class": c.cpu_class, "native_class": c.native_class, "emulated": c.emulated, "model": c.name,
            "arch": platform.machine(), "torch_kernels": torch.backends.cpu.get_cpu_capability(),
            "bf16": "native" if native_precision(torch.bfloat16) else
                    "converted" if usable_precision(torch.bfloat16) else "emulated (not used)",
            "bf16_packing": can_pack(torch.bfloat16), "emulation_gaps": emulation_gaps()}


def refresh() -> None:
    """Forget every cached answer (tests that change the switch or the environment)."""
    for fn in (read_cpu, cpu, _onednn_supports, _pack_probe):
        fn.cache_clear()


__all__ = ["CPU", "EMULATION", "SWITCH_ENV", "apply_switch", "c_compiler", "can_pack", "class_of", "cpu",
           "cpu_class", "describe", "emulation_gaps", "flags_of_class", "native_precision", "read_cpu", "refresh",
           "summary", "switch_value", "usable_precision"]
