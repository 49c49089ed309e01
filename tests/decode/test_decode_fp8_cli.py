"""`tune build/bench --phase decode --kv-dtype fp8`: what an FP8 cache kernel cannot be is refused (exit 2, the
reason) before anything is built; `tune build` compiles one without a GPU."""
import shutil

import pytest
from typer.testing import CliRunner

from tuner.commands.cli import app

runner = CliRunner()


@pytest.mark.parametrize("command,args,words", [
    ("bench", ["--variant", "mla", "--kv-dtype", "fp8"], "absorbed-MLA decode over an FP8 latent cache is not built"),
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
