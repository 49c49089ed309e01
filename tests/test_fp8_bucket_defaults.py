"""FP8 kernels in the bucket-defaults tables and the campaign's seeds: an entry that says dtype "fp8" changes the e4m3
kernels' default only, a 16-bit entry never reaches them, `tune defaults` writes an FP8 campaign's confirmed wins as
such entries, and FA3's FP8 tiles seed FP8 campaigns only."""
import json

import pytest
from typer.testing import CliRunner

from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, Problem
from search_spaces import load_space
from translate.defaults import default_params
from tuner.campaign.winners import Contender, Contest, decide
from tuner.commands.cli import app
from tuner.defaults import table
from tuner.defaults.derive import derive, read_results

H200 = load_profile("h200")
FP8 = KernelSpec("mha", 128, 128, False, "fp8")
BF16 = KernelSpec("mha", 128, 128, False, "bf16")


def _entry(dtype=None, change=None, buckets=("s16384",)):
    item = {"variants": ["mha"], "head_dim": 128, "causal": False, "buckets": list(buckets),
            "change": change or {"block_n": 224}, "measured": "MHA s16384 x1.05 x1.06"}
    if dtype is not None:
        item["dtype"] = dtype
    return item


def _write(tmp_path, *entries):
    (tmp_path / "h200.toml").write_text("\n".join(table.entry_toml(e) for e in entries))
    return tmp_path


def test_an_fp8_entry_changes_the_e4m3_kernels_only_and_a_16_bit_entry_never_reaches_them(tmp_path, monkeypatch):
    monkeypatch.setenv(table.TABLES_ENV, str(_write(tmp_path, _entry("fp8"),
                                                     _entry(None, {"pingpong": True}, ("s8192", "s16384")))))
    assert table.bucket_params(H200, FP8, "s16384").block_n == 224
    assert table.bucket_params(H200, FP8, "s8192") == default_params(H200, FP8, "ws_overlap")   # the bf16 entry's bucket
    bf16 = table.bucket_params(H200, BF16, "s16384")
    assert bf16.pingpong is True and bf16.block_n == default_params(H200, BF16, "ws_overlap").block_n
    # the same bucket of one (variant, head dim, causal) may have one entry per dtype class, not two of one
    assert "dtype = \"fp8\"" in table.entry_toml(_entry("fp8")) and "dtype" not in table.entry_toml(_entry())
    twice = _write(tmp_path, _entry("fp8"), _entry("fp8", {"kv_stages": 3}))
    monkeypatch.setenv(table.TABLES_ENV, str(twice))
    with pytest.raises(table.BucketTableError, match="both set mha d128 fp8 non-causal s16384"):
        table.load_table("h200")


def test_an_entry_naming_another_dtype_is_refused_with_the_reason():
    reasons = table.entry_reasons(_entry("bf16"), set(default_params(H200, BF16, "ws_overlap").to_dict()))
    assert reasons and "dtype must be one of fp8 (absent: the bf16 and fp16 kernels)" in reasons[0]


def _fp8_winner(bucket, seqlen, change, default_ms):
    base = default_params(H200, FP8, "ws_overlap").to_dict()
    problem = Problem("mha", 1, 16, 16, seqlen, seqlen, 128, 128, False, "fp8")

    def contender(role, sha, params, seeded, trial):
        return Contender(role, f"k_{sha}", sha, {}, params, "ws_overlap", "seed" if seeded else "search", trial, seeded)

    contest = Contest(bucket, problem, contender("challenger", "c" + bucket, {**base, **change}, False, 7), None, None,
                      contender("default", "d", base, True, 0))
    runs = [{"ms": {"challenger": [1.0] * 9, "default": [ms] * 9}, "failed": {}} for ms in default_ms]
    return decide(contest, runs).to_dict()


def test_an_fp8_campaigns_confirmed_win_becomes_an_fp8_entry_that_build_reads(tmp_path, monkeypatch):
    summary = {"study": "h200-mha-fp8-d128-noncausal", "gpu": "h200", "device_name": "NVIDIA H200",
               "spec": FP8.to_dict(), "confirm_rule": {"processes": 2},
               "winners": [_fp8_winner("s16384", 16384, {"block_n": 224}, [1.06, 1.05])]}
    studies = tmp_path / "studies" / summary["study"]
    studies.mkdir(parents=True)
    (studies / "summary.json").write_text(json.dumps(summary))

    def default_for(spec):
        return {k: v for k, v in default_params(H200, spec, "ws_overlap").to_dict().items() if k != "schedule"}

    got = derive(read_results(studies.parent), "h200", default_for)
    assert [(e.dtype, dict(e.change), e.buckets) for e in got.entries] == [("fp8", {"block_n": 224}, ["s16384"])]
    tables = tmp_path / "tables"
    monkeypatch.setenv(table.TABLES_ENV, str(tables))
    result = CliRunner().invoke(app, ["defaults", "--gpu", "h200", "--study-dir", str(studies.parent)])
    assert result.exit_code == 0, result.output
    assert 'dtype = "fp8"' in (tables / "h200.toml").read_text()
    assert table.bucket_params(H200, FP8, "s16384").block_n == 224
    assert table.bucket_params(H200, BF16, "s16384") == default_params(H200, BF16, "ws_overlap")


def test_fa3s_fp8_tiles_seed_fp8_campaigns_only():
    for variant in ("mha", "gqa", "mqa"):
        space = load_space(variant)
        fp8 = {dict(s.params)["block_n"] for s in space.seeds_for(128, dtype="fp8") if s.dtype == "fp8"}
        assert fp8 == {224}
        assert not [s for s in space.seeds_for(128, dtype="bf16") if s.dtype]
        assert {dict(s.params)["block_n"] for s in space.seeds_for(64, dtype="fp8") if s.dtype} == {160}


def test_a_seed_naming_another_dtype_is_refused():
    import tomllib

    from search_spaces import SpaceError, parse_space, spaces_dir

    data = tomllib.loads((spaces_dir() / "mha.toml").read_text())
    seed = next(s for s in data["seeds"] if s.get("dtype") == "fp8")
    seed["dtype"] = "e5m2"
    with pytest.raises(SpaceError, match="dtype must be fp8"):
        parse_space(data, "mha.toml")


@pytest.mark.parametrize("variant,head_dim", [("mha", 128), ("gqa", 128), ("mqa", 64)])
def test_an_fp8_campaign_can_seed_its_per_spec_default_and_fa3s_fp8_tile(variant, head_dim):
    """The FP8 default (V^T in accumulator order) and FA3's FP8 tile (d128 block N 224) are points of the FP8 space: a
    campaign once skipped both (its domain was the 16-bit one's, cut by the FP8 list) and never timed the default."""
    from kernel_abi.spec import grid_problems, spec_for
    from search_spaces.feasible import feasible_space

    spec = spec_for(variant, head_dim, "fp8", False)
    problems = grid_problems(variant, head_dim, "fp8", False)
    space = load_space(variant)
    feasible = feasible_space(space, H200, head_dim, "fp8", problems)
    default = {**default_params(H200, spec, "ws_overlap").to_dict(), "schedule": "ws_overlap"}
    assert default["vt_key_order"] == "accumulator"
    _, problems_seen = feasible.project(default, H200, head_dim, "fp8", problems)
    assert problems_seen == []
    for seed in space.seeds_for(head_dim, dtype="fp8"):
        if seed.dtype == "fp8":
            params = {**default, **dict(seed.params)}
            _, problems_seen = feasible.project(params, H200, head_dim, "fp8", problems)
            assert problems_seen == [], seed.source
    # the 16-bit space at the same head dim is as it was: no V^T order, d128 tiles to 192
    assert space.domain("vt_key_order", H200, head_dim, "bf16") == ("natural",)
    assert max(space.domain("hopper_block_n", H200, 128, "bf16")) == 192
