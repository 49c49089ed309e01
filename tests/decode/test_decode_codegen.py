"""Decode sketch -> kernel source, and (with nvcc) the compiled kernel: no spills, the cp.async gathers and
tensor-core MMAs in the SASS, both entry points, and the host's argument struct laid out as the device's."""
import ctypes
import dataclasses
import shutil
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from tl.parser import parse
from translate.compiler import generate
from translate.decode import DecodeParams
from translate.kernel import TranslationError
from kernel_abi.spec import KernelSpec

H100 = load_profile("h100")
SKETCHES = Path(__file__).resolve().parents[2] / "tl" / "sketches" / "decode"
PAGED_TEXT = (SKETCHES / "gqa_paged.tl").read_text()
PAGED = KernelSpec("gqa", 128, 128, True, "bf16", "paged", "decode")
HAVE_NVCC = shutil.which("nvcc") is not None


def kernel(text=PAGED_TEXT, params=DecodeParams(), spec=PAGED):
    return generate(parse(text).program, params, H100, spec)


def test_the_sketch_order_decides_when_the_next_tiles_gathers_go_out():
    first = kernel()
    assert "kPrefetchFirst = true" in first.source and "kQInRegs = true" in first.source
    copies = ("    Copy K (BN, HeadDim) in coordinate [L = j] from global to shared\n"
              "    Copy V (BN, HeadDim) in coordinate [L = j] from global to shared\n")
    late = PAGED_TEXT.replace(copies, "").replace(
        "    Compute GEMM P, V_shared and accumulate O_register\n",
        "    Compute GEMM P, V_shared and accumulate O_register\n" + copies)
    second = kernel(late)
    assert "kPrefetchFirst = false" in second.source
    assert second.name != first.name       # the sketch is part of the kernel


def test_q_from_shared_memory_when_the_sketch_keeps_it_there():
    text = PAGED_TEXT.replace("Copy Q_shared from shared to register\n", "").replace("Q_register", "Q_shared")
    assert "kQInRegs = false" in kernel(text).source


def test_the_kernel_meta_says_how_to_launch_it():
    k = kernel()
    meta = k.meta()
    assert meta["grid"] == "decode" and meta["args"] == [["args", "struct:attn_decode::Args"]]
    assert meta["spec"]["phase"] == "decode" and meta["params"]["pack_gqa"] is True
    assert f"{k.name}_combine" in k.source


@pytest.mark.parametrize("spec,words", [
    (KernelSpec("gqa", 128, 128, True, "bf16", "dense", "decode"), "paged cache"),
    (KernelSpec("gqa", 128, 128, True, "bf16", "paged", "prefill"), "asked for prefill"),
])
def test_a_spec_the_sketch_does_not_build_is_refused(spec, words):
    with pytest.raises(TranslationError, match=words):
        kernel(spec=spec)


def test_a_loop_without_the_value_gemm_is_refused_naming_the_line():
    text = PAGED_TEXT.replace("    Compute GEMM P, V_shared and accumulate O_register\n", "")
    with pytest.raises(TranslationError, match="two GEMMs") as info:
        kernel(text)
    assert info.value.line == 13


def test_prefill_params_on_a_decode_sketch_are_refused():
    from translate.params import KernelParams
    with pytest.raises(TranslationError, match="decode parameters"):
        kernel(params=KernelParams())


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not on PATH")
def test_the_kernel_compiles_without_spills_and_the_host_struct_matches(tmp_path):
    from translate.nvcc import compile_kernel
    from translate.sass import find_cuobjdump, sass_summary
    from tuner.serving.launch.decode_kernel import DecodeArgs

    k = kernel()
    checks = [f"static_assert(sizeof(attn_decode::Args) == {ctypes.sizeof(DecodeArgs)}, \"Args size\");"]
    for name, _ in DecodeArgs._fields_:
        checks.append(f"static_assert(offsetof(attn_decode::Args, {name}) == {getattr(DecodeArgs, name).offset}, "
                      f"\"{name}\");")
    k = dataclasses.replace(k, body=k.body + "\n#include <cstddef>\n" + "\n".join(checks) + "\n")
    result = compile_kernel(k, "sm_90a", cache_dir=tmp_path)
    assert result.ok, result.log[-2000:]
    assert result.spill_stores == 0 and result.spill_loads == 0
    try:
        find_cuobjdump()
    except Exception:
        pytest.skip("cuobjdump not installed")
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(result.cubin)
    main = sass_summary(cubin, k.name)
    assert main["LDGSTS"] > 0 and main["HMMA"] > 0 and main["LDSM"] > 0
    assert sass_summary(cubin, k.name + "_combine")["instructions"] > 0
