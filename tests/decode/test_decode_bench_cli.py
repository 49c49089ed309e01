"""`tune bench --phase decode`: bad input exits 2 with the reason before anything is built."""
import pytest
from typer.testing import CliRunner

from tuner.commands.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args,words", [
    (["--variant", "mla", "--params", '{"warps_n": 3}'], "warps_n 1, 2, 4 or 8"),
    (["--model", "llama3-8b", "--page-size", "24"], "--page-size must be one of"),
    (["--variant", "gqa", "--layout", "dense", "--page-size", "16"], "paged cache"),
    (["--variant", "gqa", "--layout", "varlen"], "not varlen"),
    (["--variant", "gqa", "--seqlens", "512"], "--phase decode times the decode grid"),
    (["--variant", "gqa", "--params", '{"block_n": 48}'], "multiple of 16 x warps_n"),
    (["--variant", "gqa", "--params", '{"tile": 1}'], "unknown decode parameter"),
])
def test_bad_decode_bench_input_exits_2_with_the_reason(args, words):
    result = runner.invoke(app, ["bench", "--gpu", "h100", "--phase", "decode", *args])
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_sm75_cannot_decode():
    result = runner.invoke(app, ["bench", "--gpu", "t4", "--phase", "decode", "--variant", "gqa"])
    assert result.exit_code == 2 and "sm75" in result.output


def test_an_unknown_phase_is_refused():
    result = runner.invoke(app, ["bench", "--gpu", "h100", "--phase", "prefil", "--variant", "gqa"])
    assert result.exit_code == 2 and "prefill or decode" in result.output


def test_absorbed_mla_is_built_by_tune_build_phase_decode(tmp_path):
    """`tune build --phase decode --variant mla`: the split-d_v kernel of the MLA sketch, both entry points."""
    result = runner.invoke(app, ["build", "--gpu", "h100", "--variant", "mla", "--phase", "decode", "--schedule",
                                 "decode_late", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "no decode_late sketch for mla" in result.output


@pytest.mark.slow
def test_tune_build_phase_decode_writes_both_entry_points(tmp_path):
    """`tune build --phase decode` compiles the split kernel and its combine into one cubin, with the record."""
    import json

    result = runner.invoke(app, ["build", "--gpu", "h100", "--variant", "gqa", "--phase", "decode", "--layout",
                                 "dense", "--schedule", "decode_late", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["schedule"] == "decode_late" and record["spec"]["phase"] == "decode"
    assert record["meta"]["grid"] == "decode" and record["resources"]["spill_stores"] == 0
    cubin = record_path.with_suffix(".cubin").read_bytes()
    assert record["name"].encode() in cubin and (record["name"] + "_combine").encode() in cubin
