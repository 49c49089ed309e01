"""`tune build` and the profile default candidates (translate/defaults.py)."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field

import pytest
from typer.testing import CliRunner

import translate
from hardware_profiles import available_profiles, load_profile
from translate.defaults import default_params, probe_problem
from translate.params import KernelParams, smem_bytes, validate
from tuner.build import UsageError, parse_params_arg
from tuner.commands.cli import app
from kernel_abi.spec import spec_for

HAVE_NVCC = shutil.which("nvcc") is not None
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not on PATH")
HAVE_TRANSLATOR = hasattr(translate, "generate")


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


# -- defaults -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu,variant,hd,expect", [
    ("h100", "mha", 128, (128, 64, 4)),
    ("h100", "mha", 64, (128, 128, 4)),
    ("a100", "gqa", 128, (128, 64, 4)),
    ("h100", "mla", None, (128, 64, 8)),
])
def test_default_params_follow_fa2_on_sm80_class(gpu, variant, hd, expect):
    p = default_params(load_profile(gpu), spec_for(variant, hd, "bf16", True))
    assert (p.block_m, p.block_n, p.num_warps) == expect
    assert (p.mma_atom, p.g2s_atom, p.s2r_atom) == ("SM80_16x8x16", "SM80_CP_ASYNC_CACHEGLOBAL", "SM75_U32x4_LDSM_N")
    assert p.swizzle == 3 and p.kv_stages == 1 and not p.q_in_regs


def test_default_params_on_turing_use_sm75_atoms_and_fit_under_64kb():
    t4 = load_profile("t4")
    for variant, hd in (("mha", 64), ("mha", 128), ("mqa", 128), ("mla", None)):
        spec = spec_for(variant, hd, "fp16", False)
        p = default_params(t4, spec)
        assert p.mma_atom == "SM75_16x8x8" and p.g2s_atom == "UniversalCopy128"
        assert smem_bytes(p, probe_problem(spec)) < 64 * 1024


def test_every_profile_has_a_legal_default_for_every_variant():
    for gpu in available_profiles():
        profile = load_profile(gpu)
        dtype = profile.default_dtype
        for variant, hd in (("mha", 64), ("mha", 128), ("gqa", 128), ("mqa", 64), ("mla", None)):
            for causal in (False, True):
                spec = spec_for(variant, hd, dtype, causal)
                assert validate(default_params(profile, spec), profile, probe_problem(spec)) == [], (gpu, spec)


def test_default_dtype_is_bf16_where_supported():
    assert load_profile("h100").default_dtype == "bf16"
    assert load_profile("t4").default_dtype == "fp16"


# -- --params -----------------------------------------------------------------------------------------


def test_params_from_json_string_file_and_sidecar(tmp_path):
    base = KernelParams(block_m=64, block_n=32)
    assert parse_params_arg(None, base) == base
    merged = parse_params_arg('{"block_n": 128, "num_warps": 8}', base)
    assert (merged.block_m, merged.block_n, merged.num_warps) == (64, 128, 8)
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"name": "k", "params": {"block_m": 128}}))
    assert parse_params_arg(str(f), base).block_m == 128


@pytest.mark.parametrize("text,message", [
    ('{"block_mm": 64}', "unknown kernel parameter"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "neither a JSON object nor a file"),
    ("/no/such/file.json", "neither a JSON object nor a file"),
    ('{"block_m": "a lot"}', "block_m must be an integer, got 'a lot' \\(str\\)"),
    ('{"block_n": 64.5}', "block_n must be an integer, got 64.5 \\(float\\)"),
    ('{"block_m": true}', "block_m must be an integer, got True \\(bool\\)"),
    ('{"q_in_regs": "yes"}', "q_in_regs must be true or false, got 'yes'"),
    ('{"q_in_regs": 1}', "q_in_regs must be true or false, got 1 \\(int\\)"),
    ('{"mma_atom": 5}', "mma_atom must be a string, got 5"),
    ('{"swizzle": null}', "swizzle must be an integer, got None"),
])
def test_bad_params_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        parse_params_arg(text, KernelParams())


# -- the command: input errors ------------------------------------------------------------------------


def test_unknown_gpu_exits_2_listing_the_choices(tmp_path):
    result = invoke("build", "--gpu", "nope", "--variant", "mha", "-o", str(tmp_path))
    assert result.exit_code == 2
    assert "unknown GPU 'nope'" in result.stderr and "h100" in result.stderr and "t4" in result.stderr
    assert "Traceback" not in result.output


def test_params_of_the_wrong_type_exit_2_naming_each_with_its_type_and_build_nothing(tmp_path):
    out = tmp_path / "out"
    result = invoke("build", "--gpu", "t4", "--variant", "mha", "--params", '{"block_m": "a lot", "pingpong": "no"}',
                    "-o", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.splitlines() == ["tune build: error: --params: block_m must be an integer, got 'a lot' "
                                          "(str); pingpong must be true or false, got 'no' (str)"]
    assert not out.exists()


def test_an_empty_sketch_exits_1_with_its_diagnostic_and_builds_nothing(tmp_path):
    sketch = tmp_path / "empty.tl"
    sketch.write_text("// to do\n")
    result = invoke("build", "--gpu", "t4", "--variant", "mha", "--sketch", str(sketch), "-o", str(tmp_path / "o"))
    assert result.exit_code == 1 and f"{sketch}:1:1: error[empty-program]" in result.stderr
    assert not (tmp_path / "o").exists()


def test_unknown_variant_exits_2(tmp_path):
    result = invoke("build", "--gpu", "h100", "--variant", "xqa", "-o", str(tmp_path))
    assert result.exit_code == 2 and "unknown variant" in result.stderr


def test_broken_sketch_exits_1_with_diagnostics(tmp_path):
    sketch = tmp_path / "bad.tl"
    sketch.write_text("Allocate Q in global (seq_len, HeadDim)\nCompute GEMM Q_shared, K_shared.T and get S\n")
    result = invoke("build", "--gpu", "h100", "--variant", "mha", "--sketch", str(sketch), "-o", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "bad.tl:" in result.stderr and "error[" in result.stderr
    assert not (tmp_path / "o").exists()


def test_illegal_params_exit_1_with_the_reason(tmp_path):
    result = invoke("build", "--gpu", "t4", "--variant", "mha", "--params", '{"block_m": 256, "block_n": 128}',
                    "-o", str(tmp_path))
    assert result.exit_code == 1
    assert "exceeds the 64 KB per-block limit" in result.stderr


def test_head_dim_96_reaches_the_hopper_kernels_parameters_and_80_is_refused(tmp_path):
    """--head-dim 96 is a spec (illegal parameters are then judged for mha_d96x96); 80 is refused naming the dims."""
    result = invoke("build", "--gpu", "h100", "--variant", "mha", "--head-dim", "96", "--params",
                    '{"block_n": 72}', "-o", str(tmp_path))
    assert result.exit_code == 1 and "for mha_d96x96_causal_bf16" in result.stderr
    assert "block_n 72 must be a multiple of 16" in result.stderr
    result = invoke("build", "--gpu", "h100", "--variant", "mha", "--head-dim", "80", "-o", str(tmp_path))
    assert result.exit_code == 2 and "head dim 80 is not supported; choose 64, 96, 128, 192, 256" in result.stderr
    assert not list(tmp_path.iterdir())


def test_missing_sketch_file_exits_2(tmp_path):
    result = invoke("build", "--gpu", "h100", "--variant", "mha", "--sketch", str(tmp_path / "none.tl"),
                    "-o", str(tmp_path))
    assert result.exit_code == 2 and "cannot read sketch" in result.stderr


# -- the command: outputs, with a stand-in translator (fast) ------------------------------------------


@dataclass(frozen=True)
class StandInKernel:
    name: str
    preamble: str
    body: str
    num_threads: int = 128
    smem_bytes: int = 0
    block_m: int = 128
    block_n: int = 64
    params: object = None
    spec: object = None
    extra: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.preamble + self.body

    def meta(self) -> dict:
        return {"name": self.name, "num_threads": self.num_threads, "smem_bytes": self.smem_bytes}


@needs_nvcc
def test_build_writes_cu_cubin_and_resources_json(monkeypatch, tmp_path):
    seen = {}

    def generate(program, params, profile, spec):
        seen.update(program=program, params=params, profile=profile.name, spec=spec)
        body = ('extern "C" __global__ void standin_kernel(float* x) {\n'
                '  __shared__ float s[32]; s[threadIdx.x % 32] = x[threadIdx.x]; __syncthreads();\n'
                '  x[threadIdx.x] = s[(threadIdx.x + 1) % 32];\n}\n')
        return StandInKernel("standin_kernel", "#include <cstdint>\n", body, params=params, spec=spec)

    monkeypatch.setattr(translate, "generate", generate, raising=False)
    monkeypatch.setattr(translate, "TranslationError", type("TranslationError", (Exception,), {}), raising=False)
    out = tmp_path / "out"
    result = invoke("build", "--gpu", "a100", "--variant", "gqa", "--head-dim", "64", "--no-causal",
                    "--params", '{"block_n": 64}', "-o", str(out), env={"TUNER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.output
    assert seen["program"] is not None and seen["profile"] == "a100"
    assert seen["params"].block_n == 64 and seen["params"].block_m == 128  # merged onto the default
    assert (seen["spec"].variant, seen["spec"].d_qk, seen["spec"].causal, seen["spec"].dtype) == ("gqa", 64, False, "bf16")
    assert (out / "standin_kernel.cu").read_text().startswith("#include <cstdint>")
    assert (out / "standin_kernel.cubin").stat().st_size > 0
    record = json.loads((out / "standin_kernel.json").read_text())
    assert record["arch"] == "sm_80" and record["params"]["block_n"] == 64
    assert record["resources"]["registers"] > 0 and record["resources"]["smem_static"] == 128
    assert record["spec"]["variant"] == "gqa" and record["nvcc_version"].startswith("V")
    assert record["meta"]["name"] == "standin_kernel"


@needs_nvcc
def test_build_compile_error_exits_1_and_keeps_the_log(monkeypatch, tmp_path):
    monkeypatch.setattr(translate, "generate", lambda *a: StandInKernel(
        "broken_kernel", "", 'extern "C" __global__ void broken_kernel() { nope(); }\n'), raising=False)
    monkeypatch.setattr(translate, "TranslationError", type("TranslationError", (Exception,), {}), raising=False)
    result = invoke("build", "--gpu", "h100", "--variant", "mha", "-o", str(tmp_path),
                    env={"TUNER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 1
    assert "compile-error" in result.stderr and "nope" in (tmp_path / "broken_kernel.log").read_text()


# -- the command: the real translator and nvcc (slow) -------------------------------------------------


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(not HAVE_TRANSLATOR, reason="translate.generate not available yet")
@pytest.mark.parametrize("gpu,arch,atom", [("h100", "sm_90a", "HGMMA"), ("t4", "sm_75", "HMMA")])
def test_build_reference_sketch_for_real(gpu, arch, atom, tmp_path, build_cache):
    result = invoke("build", "--gpu", gpu, "--variant", "mha", "-o", str(tmp_path),
                    env={"TUNER_CACHE_DIR": str(build_cache)})
    assert result.exit_code == 0, result.output
    jsons = list(tmp_path.glob("*.json"))
    assert len(jsons) == 1
    name = jsons[0].stem
    assert (tmp_path / f"{name}.cu").is_file() and (tmp_path / f"{name}.cubin").stat().st_size > 0
    record = json.loads(jsons[0].read_text())
    assert record["arch"] == arch and record["resources"]["registers"] > 0
    if "error" not in record["sass"]:
        assert record["sass"][atom] > 0
        if arch == "sm_90a":
            assert record["sass"]["UTMALDG"] > 0  # the default on sm90 is the warp-specialised TMA kernel
        elif arch != "sm_75":
            assert record["sass"]["LDGSTS"] > 0  # cp.async on sm80+
        else:
            assert record["sass"]["LDGSTS"] == 0  # Turing has no cp.async


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("layout,arg", [("varlen", "cu_seqlens_q"), ("paged", "page_table")])
def test_build_a_serving_layout(layout, arg, tmp_path, build_cache):
    """--layout rewrites the reference sketch's offsets (tl/layout.py) and builds the Hopper kernel that takes
    the layout's arguments, without spills but for the cp.async producer's few per-tile values of the paged
    default (translate/defaults.py CP_ASYNC_PRODUCER_REGS: none inside its copies)."""
    result = invoke("build", "--gpu", "h100", "--variant", "gqa", "--layout", layout, "-o", str(tmp_path),
                    env={"TUNER_CACHE_DIR": str(build_cache)})
    assert result.exit_code == 0, result.output
    (sidecar,) = tmp_path.glob("*.json")
    record = json.loads(sidecar.read_text())
    assert record["spec"]["layout"] == layout and f"_{layout}_" in sidecar.stem
    assert arg in [a[0] for a in record["meta"]["args"]]
    assert record["resources"]["spill_stores"] <= (32 if layout == "paged" else 0)


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("head_dim,page", [("64", "16"), ("128", "16"), ("128", "128")])
def test_build_an_fp8_paged_kernel_without_spills(head_dim, page, tmp_path, build_cache):
    """--dtype fp8 --layout paged: the e4m3 kernel reading K from the pages by the cp.async producer (pages of 16) or
    by TMA (pages of 128, whole tiles), and V^T by TMA as the FP8 varlen kernel reads it; no spill, the GEMMs of its
    varlen twin."""
    records = {}
    for layout in ("paged", "varlen"):
        out = tmp_path / layout
        result = invoke("build", "--gpu", "h100", "--variant", "gqa", "--head-dim", head_dim, "--dtype", "fp8",
                        "--layout", layout, *(["--page-size", page] if layout == "paged" else []), "-o", str(out),
                        env={"TUNER_CACHE_DIR": str(build_cache)})
        assert result.exit_code == 0, result.output
        (sidecar,) = out.glob("*.json")
        records[layout] = json.loads(sidecar.read_text())
    paged, varlen = records["paged"], records["varlen"]
    assert paged["spec"]["layout"] == "paged" and paged["spec"]["dtype"] == "fp8" and paged["page_size"] == int(page)
    assert paged["resources"]["spill_stores"] == 0 and paged["resources"]["spill_loads"] == 0
    assert paged["sass"]["QGMMA"] == varlen["sass"]["QGMMA"] > 0
    if page == "128":
        assert paged["sass"]["LDGSTS"] == 0 and paged["sass"]["UTMALDG"] == varlen["sass"]["UTMALDG"]
    else:
        assert paged["sass"]["LDGSTS"] > 0 and 0 < paged["sass"]["UTMALDG"] < varlen["sass"]["UTMALDG"]
    assert "page_table" in [a[0] for a in paged["meta"]["args"]]


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("head_dim,block_n,threshold", [("128", 224, 0), ("64", 160, 0), ("128", 224, 2)])
def test_build_fa3s_fp8_tiles_without_spills(head_dim, block_n, threshold, tmp_path, build_cache):
    """--dtype fp8 --params block_n 224 at d128 / 160 at d64 (FA3's FP8 tiles): QK^T on the declared m64nNk32 e4m3
    wgmma, V^T in 32-byte boxes (seven / five a stage); the consumers' registers (240 of two warpgroups at d128, 160
    of three at d64) hold it without spills, also with the conditional rescale (threshold 2: the output's multiply
    behind a branch)."""
    changes = {"block_n": block_n, **({"rescale_threshold": threshold} if threshold else {})}
    result = invoke("build", "--gpu", "h200", "--variant", "mha", "--head-dim", head_dim, "--no-causal", "--dtype",
                    "fp8", "--params", json.dumps(changes), "-o", str(tmp_path),
                    env={"TUNER_CACHE_DIR": str(build_cache)})
    assert result.exit_code == 0, result.output
    (sidecar,) = tmp_path.glob("*.json")
    record = json.loads(sidecar.read_text())
    assert record["params"]["block_n"] == block_n and record["resources"]["spill_stores"] == 0
    assert record["params"]["rescale_threshold"] == threshold
    assert record["sass"]["QGMMA"] > 0 and record["sass"]["UTMALDG"] == 1 + 1 + block_n // 32   # Q, K, V^T boxes


@pytest.mark.slow
@needs_nvcc
def test_build_paged_with_a_page_size(tmp_path, build_cache):
    """--page-size 16 is checked against block N and recorded; the kernel is the paged one, which takes its page
    size at run time (the same source as without --page-size: a cache hit after the test above)."""
    result = invoke("build", "--gpu", "h100", "--variant", "gqa", "--layout", "paged", "--page-size", "16",
                    "-o", str(tmp_path), env={"TUNER_CACHE_DIR": str(build_cache)})
    assert result.exit_code == 0, result.output
    (sidecar,) = tmp_path.glob("*.json")
    record = json.loads(sidecar.read_text())
    assert record["spec"]["layout"] == "paged" and (tmp_path / f"{sidecar.stem}.cubin").stat().st_size > 0
    assert record["page_size"] == 16 and record["page_sizes"] == [16, 32, 64, 128, 256]
    assert "page_size" in [a[0] for a in record["meta"]["args"]]
    assert "reads pages of 16, 32, 64, 128, 256 keys" in result.stdout and "checked for 16" in result.stdout


@pytest.mark.slow
@needs_nvcc
def test_build_paged_with_pages_of_whole_tiles_takes_the_tma_producer(tmp_path, build_cache):
    """--page-size 128 (a multiple of block N 128): the default for that page size, TMA boxes of whole pages with
    ping-pong and pv_wait "half" (translate.defaults.WHOLE_TILE_PAGES, measured ahead of cp.async at pages of 128),
    compiled without spills."""
    result = invoke("build", "--gpu", "h100", "--variant", "gqa", "--layout", "paged", "--page-size", "128",
                    "-o", str(tmp_path), env={"TUNER_CACHE_DIR": str(build_cache)})
    assert result.exit_code == 0, result.output
    (sidecar,) = tmp_path.glob("*.json")
    record = json.loads(sidecar.read_text())
    assert "_tma_" in sidecar.stem and "_pp_" in sidecar.stem and "_whalf_" in sidecar.stem
    assert record["params"]["g2s_atom"] == "SM90_TMA" and record["params"]["pv_wait"] == "half"
    assert record["page_size"] == 128 and record["resources"]["spill_stores"] == 0


@pytest.mark.parametrize("args,message", [
    (("--gpu", "h100", "--layout", "ragged"), "unknown layout 'ragged'; choose one of: dense, varlen, paged"),
    (("--gpu", "a100", "--layout", "varlen"), "the varlen layout is built by the warp-specialised Hopper schedules"),
    (("--gpu", "h100", "--layout", "paged", "--schedule", "fa2"), "the paged layout is built by the warp-specialised"),
    (("--gpu", "h100", "--layout", "paged", "--dtype", "fp8", "--window", "128,0"), "--dtype fp8 kernels take no "
                                                                                    "--window"),
])
def test_a_layout_the_target_cannot_build_exits_2(args, message, tmp_path):
    result = invoke("build", "--variant", "gqa", *args, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()
