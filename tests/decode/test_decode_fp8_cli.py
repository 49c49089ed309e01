"""`tune build/bench --phase decode --kv-dtype fp8`: what an FP8 cache kernel cannot be is refused (exit 2, the
reason) before anything is built; `tune build` compiles one without a GPU."""
import shutil

import pytest
from typer.testing import CliRunner

from tuner.commands.cli import app

runner = CliRunner()


@pytest.mark.parametrize("command,args,words", [
    ("bench", ["--model", "deepseek-v3", "--kv-dtype", "fp8", "--params",
               '{"mma": "sm90_seesaw", "kv_load": "tma", "block_m": 64, "warps_m": 4, "warps_n": 2, "kv_stages": 2}'],
     "mma.sync"),
    ("bench", ["--variant", "mla", "--kv-dtype", "fp8", "--dtype", "fp8"], "fp16 or bf16 queries"),
    ("build", ["--variant", "gqa", "--kv-dtype", "int8"], "--kv-dtype must be one of fp8"),
    ("build", ["--variant", "gqa", "--kv-dtype", "fp8", "--dtype", "fp8"], "fp16 or bf16 queries"),
    ("bench", ["--model", "llama3-8b", "--kv-dtype", "fp8", "--params", '{"mma": "sm90_seesaw"}'], "mma.sync"),
])
def test_what_no_fp8_cache_kernel_is_exits_2_with_the_reason(command, args, words, tmp_path):
    out = ["-o", str(tmp_path)] if command == "build" else []
    result = runner.invoke(app, [command, "--gpu", "h100", "--phase", "decode", *args, *out])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


@pytest.mark.parametrize("command", ["build", "bench"])
def test_kv_dtype_is_a_decode_option(command, tmp_path):
    out = ["-o", str(tmp_path)] if command == "build" else []
    result = runner.invoke(app, [command, "--gpu", "h100", "--variant", "gqa", "--kv-dtype", "fp8", *out])
    assert result.exit_code == 2 and "--kv-dtype is a decode cache's dtype" in result.output


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_tune_build_compiles_the_fp8_cache_kernel_without_spills(tmp_path):
    import json

    result = runner.invoke(app, ["build", "--gpu", "h200", "--variant", "gqa", "--phase", "decode",
                                 "--kv-dtype", "fp8", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["spec"]["kv_dtype"] == "fp8" and "kvfp8" in record["name"]
    assert record["resources"]["spill_stores"] == 0 and record["resources"]["spill_loads"] == 0
    assert record["meta"]["args"][1] == ["scales", "struct:attn_decode::KvScales"]


@pytest.mark.parametrize("args", [dict(variant="mla", model=None), dict(variant=None, model="deepseek-v3")])
def test_mla_takes_an_fp8_latent_cache(args):
    """`--variant mla` or `--model deepseek-v3` with `--kv-dtype fp8`: the absorbed spec over an e4m3 latent cache,
    its default the split-d_v mma.sync kernel (the warpgroup kernels take no e4m3 cache)."""
    from translate.decode.params import default_decode_params
    from tuner.commands.bench_decode import resolve_decode_target

    profile, spec, heads, page, _ = resolve_decode_target("h200", args["variant"], args["model"], None, None, None,
                                                          "paged", None, None, "fp8")
    assert (spec.variant, spec.d_qk, spec.d_v, spec.kv_dtype) == ("mla", 576, 512, "fp8")
    assert heads[1] == 1 and page == 64
    p = default_decode_params(spec, heads[0], profile)
    assert p.mma == "sm80" and p.kv_load == "gather"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_tune_build_compiles_the_fp8_latent_mla_kernel_without_spills(tmp_path):
    import json

    result = runner.invoke(app, ["build", "--gpu", "h200", "--variant", "mla", "--phase", "decode",
                                 "--kv-dtype", "fp8", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["spec"]["kv_dtype"] == "fp8" and record["spec"]["variant"] == "mla" and "kvfp8" in record["name"]
    assert record["resources"]["spill_stores"] == 0 and record["resources"]["spill_loads"] == 0
    assert record["meta"]["args"][1] == ["scales", "struct:attn_decode::KvScales"]
