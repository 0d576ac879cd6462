"""`aogpt.capability`: the CPU class read from what the OS reports, the lesser-CPU switch, and the
probes every instruction-set-dependent path asks (bf16 packing, native precisions, compile)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aogpt import capability
from aogpt.decode.kernels import LinearKernel
from aogpt.decode.runner import decode_linears
from aogpt.errors import AOGPTError
from aogpt.generation.generate import generate
from aogpt.inference import for_inference
from tests.generation.test_generate import tiny_model

XEON_AMX = ("fpu sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 "
            "avx512_fp16 amx_bf16 amx_tile amx_int8")
EPYC_BF16 = "fpu sse2 avx avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"
EPYC_AVX2 = "fpu sse2 avx avx2 fma f16c"


def cpuinfo(tmp_path, flags: str, key: str = "flags") -> str:
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\n{key}\t\t: {flags}\n\nprocessor\t: 1\n")
    return str(path)


@pytest.mark.parametrize("flags,arch,want", [(XEON_AMX, "x86", "amx"), (EPYC_BF16, "x86", "avx512-bf16"),
                                             (EPYC_AVX2, "x86", "avx2"), ("fpu sse2", "x86", "x86-64"),
                                             ("fp asimd fphp asimdhp bf16 i8mm", "arm", "arm64-bf16"),
                                             ("fp asimd", "arm", "arm64")])
def test_the_class_is_the_best_whose_defining_flag_the_cpu_reports(tmp_path, flags, arch, want):
    name, read = capability.read_cpu(cpuinfo(tmp_path, flags, "flags" if arch == "x86" else "Features"))
    assert name == "Test CPU" and capability.class_of(read, arch) == want
    assert capability.read_cpu(str(tmp_path / "missing")) == ("", frozenset())


def test_flags_of_a_lesser_class_hide_the_greater_units():
    avx2 = capability.flags_of_class("avx2", "x86")
    assert "avx2" in avx2 and not avx2 & {"avx512f", "avx512_bf16", "amx_bf16"}
    assert {"avx512_bf16", "avx2"} <= capability.flags_of_class("avx512-bf16", "x86")


def test_the_switch_makes_the_project_decide_as_a_lesser_cpu(as_cpu):
    as_cpu("avx2")
    c = capability.cpu()
    if c.arch != "x86" or c.native_class in ("x86-64",):
        pytest.skip(f"the avx2 class needs an x86 CPU with AVX2 (this one: {c.native_class})")
    assert c.cpu_class == "avx2" and (c.emulated == (c.native_class != "avx2"))
    assert not capability.native_precision(torch.bfloat16) and not capability.usable_precision(torch.bfloat16)
    assert not capability.can_pack(torch.bfloat16) and capability.native_precision(torch.float32)
    assert c.describe().startswith("avx2")


def test_a_switch_above_the_cpu_or_unknown_is_refused(as_cpu):
    native = capability.cpu().native_class
    classes = list(capability.X86_CLASSES if capability.cpu().arch == "x86" else capability.ARM_CLASSES)
    as_cpu("pentium")
    with pytest.raises(AOGPTError, match="is not a CPU class"):
        capability.cpu()
    if native != classes[-1]:
        as_cpu(classes[-1])
        with pytest.raises(AOGPTError, match="asks for more than this CPU has"):
            capability.cpu()


def test_the_switch_sets_torchs_own_limits_before_torch_starts_and_they_take_effect():
    """A fresh process with AOGPT_CPU=avx2 and nothing else: `import aogpt` sets oneDNN's, ATen's and
    MKL's limits, and torch then refuses bf16 packing as an AVX2 CPU does (where the CPU is above AVX2)."""
    if capability.cpu().arch != "x86" or capability.cpu().native_class in ("x86-64", "avx2"):
        pytest.skip("needs an x86 CPU above AVX2 to emulate one")
    env = {k: v for k, v in os.environ.items() if k not in capability.EMULATION["avx2"]}
    env["AOGPT_CPU"] = "avx2"
    code = ("import aogpt, os, torch\nfrom aogpt import capability\n"
            "print(os.environ['ONEDNN_MAX_CPU_ISA'], torch.backends.cpu.get_cpu_capability(),"
            " capability._pack_probe('bfloat16'), capability.emulation_gaps())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "AVX2", "False", "[]"]


def test_a_user_setting_of_torchs_limits_is_kept(monkeypatch):
    monkeypatch.setenv("AOGPT_CPU", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")
    for key in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.setenv(key, os.environ.get(key, "unset-by-test"))
    assert "ONEDNN_MAX_CPU_ISA" not in capability.apply_switch()
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2_VNNI"


def test_packing_follows_the_capability_module(as_cpu):
    """fp32 is packed wherever oneDNN is; under the avx2 class a bf16 model is not packed (the fast
    path's plain kernels) and still generates."""
    from aogpt.decode import choice

    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32)
    if not capability.can_pack(torch.float32):
        pytest.skip("no oneDNN on this machine")
    assert any(isinstance(m, LinearKernel) and m.onednn for m in for_inference(model).modules())
    as_cpu("avx2")
    choice.forget()
    bf16 = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32).to(torch.bfloat16)
    assert for_inference(bf16, path="reference") is bf16
    assert all(k.kind == "plain" for k in decode_linears(for_inference(bf16)).values())
    res = generate(bf16, num_samples=2, length=8, steps=4, seed=0)
    assert res.tokens.shape == (2, 8)
    choice.forget()


@pytest.mark.skipif(capability._pack_probe("bfloat16"),
                    reason="needs a CPU whose oneDNN refuses bf16 weights: an AVX2 CPU, or the suite under "
                    "AOGPT_CPU=avx2 as scripts/test.sh runs it")
def test_bf16_generation_takes_the_avx2_path_and_fails_without_the_capability_module(monkeypatch):
    """On a CPU that refuses bf16 packing, generation with a bf16 model works (plain linear layers),
    and bypassing the capability module brings back the refusal users saw as a traceback."""
    import aogpt.inference as inference
    from aogpt.decode import choice

    model = tiny_model("aogpt", vocab=16, block=8, dtype=torch.float32).to(torch.bfloat16)
    for path in ("fast", "reference"):
        assert generate(model, num_samples=2, length=8, steps=4, seed=0, decode_path=path).tokens.shape == (2, 8)
    monkeypatch.setattr(inference.capability, "can_pack", lambda dtype: True)  # the module bypassed
    inference._KEPT.clear()
    choice.forget()
    with pytest.raises(RuntimeError, match="bf16 path needs the cpu support"):  # the one packer: the fast path's
        generate(model, num_samples=2, length=8, steps=4, seed=0, decode_path="fast")
    choice.forget()


def test_probes_are_cached_once_per_process(monkeypatch):
    capability.refresh()
    calls = []
    real = capability._onednn_supports.__wrapped__

    def counted(precision):
        calls.append(precision)
        return real(precision)

    monkeypatch.setattr(capability, "_onednn_supports", __import__("functools").cache(counted))
    for _ in range(3):
        capability.native_precision(torch.bfloat16)
        capability.usable_precision(torch.bfloat16)
    assert calls.count("bfloat16") <= 1
    capability.refresh()


def test_summary_names_the_class_and_torchs_kernels():
    s = capability.summary()
    assert s["cpu_class"] == capability.cpu_class() and s["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert s["bf16"] in ("native", "converted", "emulated (not used)")
    assert capability.describe().startswith(f"CPU {s['cpu_class']}")
