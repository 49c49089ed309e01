"""scripts/table_ab.py's CPU part: which kernel each table serves per bucket, its bad input, and the summary."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec

REPO = Path(__file__).resolve().parents[1]
H100_TABLE = REPO / "hardware_profiles" / "bucket_defaults" / "h100.toml"
MHA64C = KernelSpec("mha", 64, 64, True, "bf16")
BUCKETS = ["s512", "s1024", "s2048", "s4096", "s8192", "s16384"]


def _tool():
    sys.path.insert(0, str(REPO / "scripts"))
    import table_ab

    return table_ab


def _table(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return f"{name}={path}"


OTHER = """
[[change]]
variants = ["mha"]
head_dim = 64
causal = true
buckets = ["s512", "s8192"]
change = { block_n = 96, pingpong = true }
measured = "MHA s512 x1.010 x1.012, s8192 x1.004 x1.006"
"""


def test_each_table_serves_its_change_per_bucket_and_the_default_elsewhere(tmp_path):
    tool = _tool()
    tables = tool.parse_tables([f"h100={H100_TABLE}", _table(tmp_path, "other", OTHER), _table(tmp_path, "none", "")])
    kernels, served = tool.plan(load_profile("h200"), MHA64C, tables, BUCKETS)
    assert list(kernels)[0] == "default" and kernels["default"] == {}
    # the H100 table's MHA d64 causal entries (s512/s1024 one tile, s2048 another) and the default elsewhere
    assert served["h100"]["s512"] == served["h100"]["s1024"] == "block_m=128,num_warps=8,producer_regs=24"
    assert served["h100"]["s2048"] == "block_n=96,kv_stages=3,rescale_threshold=8"
    assert served["other"] == {"s512": "block_n=96,pingpong=True", "s1024": "default", "s2048": "default",
                               "s4096": "default", "s8192": "block_n=96,pingpong=True", "s16384": "default"}
    assert set(served["none"].values()) == {"default"}
    assert kernels["block_n=96,pingpong=True"] == {"block_n": 96, "pingpong": True}   # one kernel for two buckets
    assert len(kernels) == len({r for s in served.values() for r in s.values()} | {"default"})


@pytest.mark.parametrize("args, words", [
    (["a=x.toml"], "at least two"),
    (["a", "b=y"], "NAME=PATH"),
    (["fa4=x", "b=y"], "names a column"),
    (["a=/nonexistent/a.toml", "b=y"], "cannot read"),
])
def test_bad_tables_are_refused_with_the_reason(tmp_path, args, words):
    with pytest.raises(ValueError, match=words):
        _tool().parse_tables(args)


def test_a_table_that_does_not_read_or_that_the_profile_refuses_is_named(tmp_path):
    tool = _tool()
    with pytest.raises(ValueError, match="--table bad"):
        tool.parse_tables([f"h100={H100_TABLE}", _table(tmp_path, "bad", "[[change]]\nvariants = 3\n")])
    illegal = OTHER.replace("block_n = 96, pingpong = true", "block_n = 176")
    tables = tool.parse_tables([f"h100={H100_TABLE}", _table(tmp_path, "big", illegal)])
    with pytest.raises(ValueError, match="--table big: .*not legal on h200"):
        tool.plan(load_profile("h200"), MHA64C, tables, BUCKETS)


def _row(seqlen, ratios, fa4):
    return {"seqlen": seqlen, "tables": {
        n: {"vs_reference": {"ratio": r, "low": r - 0.01, "high": r + 0.01, "confirmed": r - 0.01 > 1.001},
            "vs_default": {"ratio": r}, "over_fa4": fa4} for n, r in ratios.items()}}


def test_the_summary_is_a_geometric_mean_with_fa4_at_2k_and_up():
    rows = [_row(1024, {"a": 1.0, "b": 1.10}, 0.5), _row(4096, {"a": 1.0, "b": 0.90}, 1.0),
            _row(16384, {"a": 1.0, "b": 1.00}, 1.21)]
    s = _tool().summarise(rows, ["a", "b"])
    assert s["a"]["vs_reference"] == pytest.approx(1.0) and s["a"]["faster"] == 0
    assert s["b"]["vs_reference"] == pytest.approx((1.1 * 0.9) ** (1 / 3))
    assert s["b"]["over_fa4_2k"] == pytest.approx(1.1)            # sqrt(1.0 * 1.21): the 1k point left out
    assert (s["b"]["faster"], s["b"]["slower"], s["b"]["points"]) == (1, 1, 3)
