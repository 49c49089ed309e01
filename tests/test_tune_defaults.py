"""`tune defaults`: a GPU's bucket-defaults table from its campaigns' confirmed wins over the per-spec default
(tuner/defaults/derive.py, tuner/commands/defaults.py), and `--no-bucket-table`."""
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware_profiles import load_profile
from kernel_abi.spec import KernelSpec, Problem
from translate.defaults import default_params
from tuner.campaign.winners import Contender, Contest, decide
from tuner.commands.cli import app
from tuner.defaults import table
from tuner.defaults.derive import derive, read_results

PROFILE = load_profile("h100")
SPEC = KernelSpec("mha", 64, 64, False, "bf16")
BASE = {k: v for k, v in default_params(PROFILE, SPEC, "ws_overlap").to_dict().items()}


def _contender(role, sha, change=None, schedule="ws_overlap", seeded=False, trial=None):
    return Contender(role, f"k_{sha}", sha, {}, {**BASE, **(change or {})}, schedule,
                     "seed" if seeded else "search", trial, seeded)


def _winner(bucket, seqlen, change, default_ms, schedule="ws_overlap", challenger_ms=1.0):
    """A bucket's decision as the campaign writes it (winners.decide(...).to_dict()): the challenger with ``change``
    against the per-spec default, one re-timing per entry of ``default_ms`` (9 rounds each)."""
    problem = Problem("mha", 1, 16, 16, seqlen, seqlen, 64, 64, False, "bf16")
    contest = Contest(bucket, problem, _contender("challenger", "c" + bucket, change, schedule, trial=9), None, None,
                      _contender("default", "d", seeded=True, trial=0))
    runs = [{"ms": {"challenger": [challenger_ms] * 9, "default": [ms] * 9}, "failed": {}} for ms in default_ms]
    return decide(contest, runs).to_dict()


def _summary(study, winners, gpu="h100", spec=SPEC):
    return {"study": study, "gpu": gpu, "device_name": "NVIDIA H100 80GB HBM3", "spec": spec.to_dict(),
            "confirm_rule": {"processes": 2}, "winners": winners}


def _study_dir(tmp_path, *summaries):
    root = tmp_path / "studies"
    for s in summaries:
        (root / s["study"]).mkdir(parents=True)
        (root / s["study"] / "summary.json").write_text(json.dumps(s))
    return root


def _default_for(spec):
    return {k: v for k, v in default_params(PROFILE, spec, "ws_overlap").to_dict().items() if k != "schedule"}


def test_confirmed_wins_become_entries_grouped_by_change_and_everything_else_is_left_out_with_its_reason(tmp_path):
    winners = [
        _winner("s512", 512, {"pingpong": True}, [1.03, 1.02]),
        _winner("s1024", 1024, {"pingpong": True}, [1.04, 1.03]),            # the same change: one entry, two buckets
        _winner("s2048", 2048, {"block_n": 112}, [1.03, 1.0]),                # the second process did not confirm
        _winner("s4096", 4096, {"block_n": 112}, [1.03]),                     # one process only
        _winner("s8192", 8192, {"block_n": 112}, [1.05, 1.05], schedule="fa2"),   # not the default's schedule
        _winner("s16384", 16384, {"block_n": 112}, [1.0, 1.0]),               # the default stands
    ]
    got = derive(read_results(_study_dir(tmp_path, _summary("h100-mha-bf16-d64-noncausal", winners))), "h100",
                 _default_for)
    assert [(e.variant, e.head_dim, e.causal, dict(e.change), e.buckets) for e in got.entries] == [
        ("mha", 64, False, {"pingpong": True}, ["s512", "s1024"])]
    assert got.entries[0].measured() == "MHA s512 x1.030 x1.020, s1024 x1.040 x1.030"
    notes = "\n".join(got.notes)
    assert "s2048" in notes and "not confirmed" in notes
    assert "s4096" in notes and "1 fresh process(es), the table needs 2" in notes
    assert "s8192" in notes and "schedule 'fa2'" in notes
    assert "s16384" in notes and "not confirmed" in notes
    assert len(got.records) == 1 and got.records[0]["winners"] == json.loads(json.dumps(winners))


def test_a_campaign_of_another_gpu_or_an_older_default_gives_nothing_and_the_better_of_two_campaigns_is_kept(tmp_path):
    stale = _winner("s512", 512, {"pingpong": True}, [1.05, 1.05])
    stale["default"]["params"] = {**BASE, "block_n": 96}                      # the default the campaign timed
    other_gpu = _summary("h200-mha", [_winner("s512", 512, {"pingpong": True}, [1.05, 1.05])], gpu="h200")
    fp16 = _summary("h100-mha-fp16", [_winner("s1024", 1024, {"pingpong": True}, [1.02, 1.02])],
                    spec=KernelSpec("mha", 64, 64, False, "fp16"))
    bf16 = _summary("h100-mha-bf16", [stale, _winner("s1024", 1024, {"block_n": 112}, [1.04, 1.04])])
    got = derive(read_results(_study_dir(tmp_path, other_gpu, fp16, bf16)), "h100", _default_for)
    assert [(dict(e.change), e.buckets) for e in got.entries] == [({"block_n": 112}, ["s1024"])]
    notes = "\n".join(got.notes)
    assert "has changed since the campaign timed it" in notes
    assert "h100-mha-fp16 s1024: x1.020 left for h100-mha-bf16's x1.040" in notes
    assert len(got.records) == 2                                              # the h200 campaign is not a record


def _run(args, monkeypatch, tables):
    monkeypatch.setenv(table.TABLES_ENV, str(tables))
    return CliRunner().invoke(app, args)


def test_tune_defaults_writes_the_table_build_reads_and_its_records_derive_it_again(tmp_path, monkeypatch):
    studies = _study_dir(tmp_path, _summary("h100-mha-bf16-d64-noncausal", [
        _winner("s512", 512, {"pingpong": True}, [1.03, 1.02]),
        _winner("s16384", 16384, {"block_n": 112}, [1.02, 1.03])]))
    tables = tmp_path / "tables"
    result = _run(["defaults", "--gpu", "h100", "--study-dir", str(studies)], monkeypatch, tables)
    assert result.exit_code == 0, result.output
    assert "2 change(s) over 2 bucket(s) from 1 campaign(s)" in result.output and "use it from now on" in result.output
    written = (tables / "h100.toml").read_text()
    assert 'measured = "MHA s512 x1.030 x1.020"' in written
    # what tune build --seqlen, tune bench and the default export read
    assert table.bucket_params(PROFILE, SPEC, "s512").pingpong is True
    assert table.bucket_params(PROFILE, SPEC, "s16384").block_n == 112
    assert table.bucket_params(PROFILE, SPEC, "s4096") == default_params(PROFILE, SPEC, "ws_overlap")
    assert table.bucket_params(PROFILE, KernelSpec("mha", 64, 64, False, "fp16"), "s512").pingpong is True
    records = tables / "records" / "h100"
    assert [p.name for p in records.iterdir()] == ["campaign-h100-mha-bf16-d64-noncausal.json"]
    # an existing table is replaced only with --force; from the records, the same entries
    again = _run(["defaults", "--gpu", "h100", "--study-dir", str(records)], monkeypatch, tables)
    assert again.exit_code == 2 and "exists" in again.output and "--force" in again.output
    printed = _run(["defaults", "--gpu", "h100", "--study-dir", str(records), "-o", "-"], monkeypatch, tables)
    assert printed.exit_code == 0
    strip = lambda text: [l for l in text.splitlines() if not l.startswith("#")]   # noqa: E731
    assert strip(printed.output) == strip(written)


def test_the_h200_table_is_what_its_campaigns_records_give(monkeypatch):
    """The H200's table was made by `tune defaults` from its three campaigns (MHA d64 causal, MHA d128 non-causal,
    GQA d128 causal, no table seeded); their records re-derive the same entries, and `tune build` reads them."""
    tables = Path(table.TABLE_DIR)
    printed = _run(["defaults", "--gpu", "h200", "--study-dir", str(tables / "records" / "h200"), "-o", "-"],
                   monkeypatch, tables)
    assert printed.exit_code == 0, printed.output
    strip = lambda text: [l for l in text.splitlines() if not l.startswith("#")]   # noqa: E731
    assert strip(printed.output) == strip((tables / "h200.toml").read_text())
    h200 = load_profile("h200")
    gqa = KernelSpec("gqa", 128, 128, True, "bf16")
    assert [table.bucket_params(h200, gqa, b).pack_gqa for b in ("s512", "s4096", "s8192")] == [True, True, False]
    assert table.bucket_params(h200, gqa, "s16384") == default_params(h200, gqa, "ws_overlap")


def test_tune_defaults_refuses_bad_input_in_one_line(tmp_path, monkeypatch):
    tables = tmp_path / "tables"
    cases = [
        (["defaults", "--gpu", "h900", "--study-dir", str(tmp_path)], 2, "h900"),
        (["defaults", "--gpu", "h100", "--study-dir", str(tmp_path / "none")], 2, "does not exist"),
        (["defaults", "--gpu", "h100", "--study-dir", str(tmp_path)], 1, "no campaign of h100"),
    ]
    for args, code, words in cases:
        result = _run(args, monkeypatch, tables)
        assert result.exit_code == code, (args, result.output)
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not tables.exists()


def test_no_bucket_table_hides_every_table_from_defaults_and_campaign_seeds(monkeypatch):
    from tuner.campaign.driver import bucket_default_seeds, per_spec_default_seed, tables_hidden

    causal = KernelSpec("gqa", 64, 64, True, "bf16")
    monkeypatch.setenv(table.TABLES_ENV, "")     # "" reads the shipped tables; set (not deleted) so the CLI's hiding is undone
    assert table.bucket_change(PROFILE, causal, "s512") is not None and bucket_default_seeds(PROFILE, causal)
    assert not tables_hidden()
    result = CliRunner().invoke(app, ["build", "--gpu", "h900", "--variant", "mha", "-o", "x", "--no-bucket-table"])
    assert result.exit_code != 0 and os.environ[table.TABLES_ENV] == table.NO_TABLES   # set before the build runs
    assert tables_hidden() and table.load_table("h100") == ()
    assert table.bucket_params(PROFILE, causal, "s512") == default_params(PROFILE, causal, "ws_overlap")
    assert bucket_default_seeds(PROFILE, causal) == []
    (seed,) = per_spec_default_seed(PROFILE, causal)                       # the default alone is seeded
    assert seed[0]["schedule"] == "ws_overlap" and seed[1].startswith("the per-spec default")
    assert per_spec_default_seed(load_profile("a100"), causal) == []      # no bucket defaults off sm90
