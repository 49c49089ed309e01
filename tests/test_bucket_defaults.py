"""Per-bucket defaults (tuner/defaults/table.py, hardware_profiles/bucket_defaults/): the table's checks, which
kernel each bucket gets, and the consumers (`tune build --seqlen`, `tune bench`'s grouping, the default export,
a campaign's seeds). No GPU."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from hardware_profiles import available_profiles, load_profile
from translate.defaults import default_params, probe_problem
from translate.params import validate
from tuner.defaults.table import (BucketTableError, bucket_change, bucket_defaults, bucket_params, group_by_params,
                                   load_table, parse_table, params_for_seqlen)
from tuner.serving.buckets.seqlen import BUCKETS, bucket_name
from tuner.commands.cli import app
from kernel_abi.spec import KernelSpec

H100 = load_profile("h100")
MHA64C = KernelSpec("mha", 64, 64, True, "bf16")
GQA128N = KernelSpec("gqa", 128, 128, False, "bf16")
ALL_BUCKETS = [bucket_name(e) for e in BUCKETS]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def entry(**over):
    base = dict(variants=["mha"], head_dim=64, causal=True, buckets=["s512"], change={"block_n": 96},
                measured="paired rounds, run 1")
    return {**base, **over}


# -- the table's checks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,words", [
    (entry(variants=["mlp"]), "variants must be"),
    (entry(variants=[]), "variants must be"),
    (entry(head_dim=0), "head_dim must be"),
    (entry(causal="yes"), "causal must be"),
    (entry(buckets=["s3000"]), "buckets must be among"),
    (entry(buckets=["4096"]), "bucket names"),
    (entry(change={}), "non-empty table"),
    (entry(change={"block_q": 64}), "KernelParams does not have: block_q"),
    (entry(measured=" "), "measured must say"),
    ({k: v for k, v in entry().items() if k != "measured"}, "missing measured"),
    (entry(reason="x"), "unknown keys reason"),
])
def test_a_malformed_entry_is_refused_with_its_number_and_reason(bad, words):
    with pytest.raises(BucketTableError) as exc:
        parse_table({"change": [entry(), bad]}, "t.toml")
    assert "t.toml: change 2:" in str(exc.value) and words in str(exc.value)


def test_two_entries_for_one_bucket_are_refused():
    with pytest.raises(BucketTableError, match="change 2 and change 1 both set mha d64 causal s512"):
        parse_table({"change": [entry(), entry(variants=["mqa", "mha"], change={"block_n": 112})]}, "t.toml")


def test_unknown_top_level_keys_and_bad_toml_are_refused(tmp_path):
    with pytest.raises(BucketTableError, match="unknown top-level keys defaults"):
        parse_table({"defaults": []}, "t.toml")
    (tmp_path / "zz.toml").write_text("[[change]\n")
    with pytest.raises(BucketTableError, match="not valid TOML"):
        load_table("zz", tmp_path)
    assert load_table("nothing-here", tmp_path) == ()


def test_a_change_the_profile_refuses_is_an_error_naming_the_reasons(monkeypatch):
    import tuner.defaults.table as bd

    table = parse_table({"change": [entry(buckets=["s1024"], change={"block_n": 176, "pingpong": True})]}, "t.toml")
    monkeypatch.setattr(bd, "load_table", lambda gpu: table)
    with pytest.raises(BucketTableError, match="not legal: .*registers"):
        bucket_params(H100, MHA64C, "s1024")
    assert bucket_params(H100, MHA64C, "s2048") == default_params(H100, MHA64C, "ws_overlap")


# -- the shipped tables ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu", available_profiles())
def test_every_shipped_bucket_default_is_legal_on_its_profile(gpu):
    profile = load_profile(gpu)
    for item in load_table(gpu):
        for variant in item.variants:
            spec = KernelSpec(variant, item.head_dim, item.head_dim, item.causal, item.dtype or "bf16")
            for bucket in item.buckets:
                params = bucket_params(profile, spec, bucket)
                assert validate(params, profile, probe_problem(spec), warp_specialized=True) == []
                assert params != default_params(profile, spec, "ws_overlap"), (gpu, variant, bucket)


def test_the_h100_table_gives_the_measured_kernels_per_bucket():
    d64c = bucket_defaults(H100, MHA64C)
    assert {b: (p.block_m, p.block_n, p.rescale_threshold, p.pingpong) for b, p in d64c.items()} == {
        "s512": (128, 128, 0, False), "s1024": (128, 128, 0, False), "s4096": (192, 96, 8, False),
        "s8192": (192, 96, 8, False), "s2048": (192, 96, 8, False), "s16384": (192, 96, 8, False)}
    assert d64c["s512"].num_warps == 8 and d64c["s2048"].kv_stages == 3
    gqa = bucket_defaults(H100, GQA128N)   # re-timed against the current default: short keys only
    assert [b for b, p in gqa.items() if p.pingpong and p.producer_regs == 56 and p.pack_gqa] == ["s512", "s1024"]
    assert not any(p.pingpong or p.pack_gqa for b, p in gqa.items() if b in ("s2048", "s4096", "s8192"))
    assert gqa["s16384"].pingpong and not gqa["s16384"].persistent and gqa["s16384"].block_n == 128
    assert "s1024 x1.032 x1.024" in bucket_change(H100, GQA128N, "s1024").measured
    gqa64 = bucket_defaults(H100, KernelSpec("gqa", 64, 64, True, "bf16"))   # packed heads: the per-spec default
    assert all(p.pack_gqa for p in gqa64.values()) and gqa64["s8192"].block_n == 96
    assert gqa64["s4096"] == default_params(H100, KernelSpec("gqa", 64, 64, True, "bf16"), "ws_overlap")
    mha64n = bucket_defaults(H100, KernelSpec("mha", 64, 64, False, "bf16"))
    assert [b for b, p in mha64n.items() if p.pingpong] == ["s512", "s4096"]
    assert mha64n["s4096"].block_n == 112 and mha64n["s16384"].block_n == 112 and not mha64n["s16384"].pingpong


@pytest.mark.parametrize("spec", [
    KernelSpec("gqa", 64, 64, False, "bf16"),                       # GQA d64 non-causal was not measured
    KernelSpec("mha", 64, 64, True, "bf16", "paged"),               # serving layouts keep their defaults
    KernelSpec("mla", 192, 128, True, "bf16"),
])
def test_specs_the_table_does_not_cover_keep_the_per_spec_default_everywhere(spec):
    assert set(p.key() for p in bucket_defaults(H100, spec).values()) == {default_params(H100, spec,
                                                                                          "ws_overlap").key()}


def test_other_gpus_and_the_fa2_schedule_keep_the_per_spec_default():
    assert load_table("a100") == ()
    # each GPU reads its own table: the H100's MQA d64 entries are not the H200's (its campaigns did not cover MQA)
    h200, mqa64c = load_profile("h200"), KernelSpec("mqa", 64, 64, True, "bf16")
    assert bucket_params(H100, mqa64c, "s512") != default_params(H100, mqa64c, "ws_overlap")
    assert bucket_params(h200, mqa64c, "s512") == default_params(h200, mqa64c, "ws_overlap")
    assert bucket_params(H100, MHA64C, "s512", "fa2") == default_params(H100, MHA64C, "fa2")
    with pytest.raises(ValueError, match="not a shape bucket"):
        bucket_params(H100, MHA64C, "4096")


def test_seqlens_fall_into_their_buckets_and_group_by_kernel():
    assert params_for_seqlen(H100, MHA64C, 700).block_m == 128           # s1024
    assert params_for_seqlen(H100, MHA64C, 100000).block_n == 96         # past the last edge: s16384
    groups = group_by_params(H100, MHA64C, [512, 1024, 2048, 4096, 8192])
    assert [(p.block_m, p.kv_stages, p.pingpong, s) for p, s in groups] == [
        (128, 2, False, [512, 1024]), (192, 3, False, [2048]), (192, 2, False, [4096, 8192])]
    mla = KernelSpec("mla", 192, 128, True, "bf16")   # not in the table: one group, the per-spec default
    (only,) = group_by_params(H100, mla, [2048, 4096, 8192])
    assert only[1] == [2048, 4096, 8192] and only[0] == default_params(H100, mla, "ws_overlap")


# -- consumers -----------------------------------------------------------------------------------------------------

@needs_nvcc
def test_tune_build_seqlen_builds_that_buckets_default(tmp_path):
    res = CliRunner().invoke(app, ["build", "--gpu", "h100", "--variant", "mha", "--head-dim", "64", "--causal",
                                   "--dtype", "bf16", "--seqlen", "16384", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["params"]["block_n"] == 96 and record["params"]["rescale_threshold"] == 8
    assert record["bucket_default"]["bucket"] == "s16384" and record["bucket_default"]["change"] == {
        "block_n": 96, "rescale_threshold": 8} and "s16384 x1.034" in record["bucket_default"]["measured"]
    assert "default of bucket s16384" in res.output


@pytest.mark.parametrize("args,words", [
    (["--seqlen", "0"], "--seqlen must be a positive integer"),
    (["--seqlen", "1024", "--layout", "varlen"], "picks a dense bucket's default"),
    (["--seqlen", "1024", "--phase", "decode"], "split is chosen per call"),
])
def test_tune_build_seqlen_refuses_what_it_cannot_mean(tmp_path, args, words):
    res = CliRunner().invoke(app, ["build", "--gpu", "h100", "--variant", "mha", "--head-dim", "64", "--causal",
                                   "-o", str(tmp_path), *args])
    assert res.exit_code == 2 and words in res.output


def test_tune_bench_builds_one_kernel_per_bucket_default(monkeypatch):
    from rich.console import Console

    from translate import nvcc
    from tuner.build import build_kernels

    monkeypatch.setattr(nvcc, "compile_kernels", lambda gens, arch, **kw: [type("R", (), {"ok": True})()
                                                                           for _ in gens])
    targets = [(H100, MHA64C), (H100, KernelSpec("mha", 128, 128, True, "bf16"))]
    built, code = build_kernels(targets, "mha", None, None, H100, Console(), None, "ws_overlap",
                                 [512, 1024, 2048, 16384])
    assert code == 0
    assert [(b.spec.d_qk, b.params.block_m, b.params.pingpong, b.params.persistent, b.seqlens) for b in built] == [
        (64, 128, False, True, (512, 1024)), (64, 192, False, True, (2048,)), (64, 192, False, True, (16384,)),
        (128, 128, True, True, (512, 1024)), (128, 128, False, True, (2048,)), (128, 128, False, False, (16384,))]
    built, _ = build_kernels(targets[1:], "mha", None, None, H100, Console(), None, "ws_overlap", [2048, 4096])
    assert [b.seqlens for b in built] == [None]      # one default serves them all: one kernel, as before
    built, _ = build_kernels(targets[:1], "mha", '{"block_n": 112}', None, H100, Console(), None, "ws_overlap",
                              [512, 2048])
    assert [(b.params.block_m, b.params.block_n, b.seqlens) for b in built] == [(192, 112, None)]   # --params: one


def test_the_default_export_compiles_each_buckets_kernel_once(monkeypatch):
    from translate import nvcc
    from tuner.defaults.export import compile_defaults

    seen = []
    monkeypatch.setattr(nvcc, "compile_kernels", lambda gens, arch, **kw: seen.extend(g.name for g in gens) or [
        type("R", (), {"ok": True, "cubin": b"x", "log": ""})() for _ in gens])
    kernels = compile_defaults("h100", [MHA64C, KernelSpec("gqa", 128, 128, True, "bf16", "paged")],
                               buckets=("s512", "s1024", "s4096"))
    assert [(k.spec.layout, k.generated.params.block_m, k.buckets) for k in kernels] == [
        ("dense", 128, ("s512", "s1024")), ("dense", 192, ("s4096",)), ("paged", 128, None)]
    assert len(seen) == 3
    (one,) = compile_defaults("h100", [MHA64C])      # no buckets asked: the per-spec default, as before
    assert one.buckets is None and one.generated.params == default_params(H100, MHA64C, "ws_overlap")


def test_the_default_export_compiles_a_paged_kernel_per_distinct_page_size_default(monkeypatch):
    """translate.defaults.WHOLE_TILE_PAGES: pages that are whole 128-key tiles get the TMA producer with pv_wait
    "half" (measured ahead of the cp.async producer at pages of 128 in three processes); smaller pages share the
    cp.async kernel; no page sizes asked: the page-agnostic default."""
    from translate import nvcc
    from tuner.defaults.export import compile_defaults

    monkeypatch.setattr(nvcc, "compile_kernels", lambda gens, arch, **kw: [
        type("R", (), {"ok": True, "cubin": b"x", "log": ""})() for _ in gens])
    paged = KernelSpec("gqa", 128, 128, True, "bf16", "paged")
    kernels = compile_defaults("h100", [paged], page_sizes=(16, 128, 64, 256))
    assert [(k.generated.params.g2s_atom, k.generated.params.pv_wait, k.page_sizes) for k in kernels] == [
        ("SM80_CP_ASYNC_CACHEGLOBAL", "after", (16, 64)), ("SM90_TMA", "half", (128, 256))]
    assert all(k.generated.params.pingpong for k in kernels)
    (agnostic,) = compile_defaults("h100", [paged])
    assert agnostic.page_sizes is None and agnostic.generated.params == default_params(H100, paged, "ws_overlap")
    d64 = compile_defaults("h100", [KernelSpec("gqa", 64, 64, True, "bf16", "paged")], page_sizes=(16, 128))
    assert [k.page_sizes for k in d64] == [(16, 128)]      # not measured at d64: one cp.async kernel


def test_a_dense_campaign_is_seeded_with_the_bucket_defaults():
    from tuner.campaign.driver import bucket_default_seeds

    seeds = bucket_default_seeds(H100, MHA64C)
    assert [(p["block_m"], p["block_n"], p["kv_stages"], p["schedule"]) for p, _, _ in seeds] == [
        (128, 128, 2, "ws_overlap"), (192, 96, 3, "ws_overlap"), (192, 96, 2, "ws_overlap")]
    assert "s512,s1024" in seeds[0][1] and "s512 x1.059" in seeds[0][2] and not any(p["pingpong"] for p, _, _ in seeds)
    assert bucket_default_seeds(load_profile("a100"), MHA64C) == []
    assert bucket_default_seeds(H100, KernelSpec("mla", 192, 128, True, "bf16")) == []


# -- scripts/param_ab_check.py's inputs ----------------------------------------------------------------------------

def _ab():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import param_ab_check

    return param_ab_check


def test_param_ab_check_reads_one_or_several_named_changes(tmp_path):
    ab = _ab()
    assert ab.parse_changes('{"block_n": 96}', None) == {"changed": {"block_n": 96}}
    (tmp_path / "c.json").write_text('{"a": {"block_n": 96}, "b": {"pingpong": true}}')
    assert list(ab.parse_changes(None, f"@{tmp_path / 'c.json'}")) == ["a", "b"]
    assert ab.parse_changes(None, None, before=True) == {}   # --before alone: the default against the old kernel
    for change, changes, words in [(None, None, "exactly one"), ("{}", None, "non-empty JSON object"),
                                   (None, '{"default": {"block_n": 96}}', "may not be named"),
                                   (None, '{"before": {"block_n": 96}}', "may not be named"),   # --before's row
                                   (None, '{"a": {"block_q": 1}}', "not KernelParams fields: block_q"),
                                   (None, "@/nonexistent/c.json", "cannot read")]:
        with pytest.raises(ValueError, match=words):
            ab.parse_changes(change, changes)


def test_param_ab_check_skips_the_changes_a_spec_cannot_take():
    ab = _ab()
    legal, refused = ab.legal_changes("h100", MHA64C, {"n96": {"block_n": 96}, "n176": {"block_n": 176}})
    assert list(legal) == ["n96"] and "registers" in refused["n176"][0]


# -- scripts/bucket_table.py: the table re-derived from its records -------------------------------------------------

RECORDS = Path(__file__).resolve().parents[1] / "hardware_profiles" / "bucket_defaults" / "records"


def _table_script():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bucket_table

    return bucket_table


def _record(changes, rows, pingpong_revision="current"):
    """A param_ab_check --changes record: rows of (spec, seqlen, {name: (ratio, confirmed)}), timed with the current
    ping-pong kernel (``pingpong_revision`` None: a record from before the field, i.e. revision 1)."""
    revision = {} if pingpong_revision is None else {
        "pingpong_revision": _table_script().PINGPONG_REVISION if pingpong_revision == "current" else pingpong_revision}
    return {**revision, "changes": changes, "rows": [
        {"spec": spec, "seqlen": seqlen,
         "verdicts": {n: {"ratio": r, "low": r - 0.01, "high": r + 0.01, "confirmed": ok} for n, (r, ok) in v.items()}}
        for spec, seqlen, v in rows]}


def test_a_change_needs_a_confirmed_win_in_every_process_and_at_least_two():
    bt = _table_script()
    a, b = {"n96": {"block_n": 96}, "pp": {"pingpong": True}}, {"x": {"block_n": 96}}
    records = [_record(a, [("mha64c", 2048, {"n96": (1.03, True), "pp": (1.05, True)}),
                           ("mha64c", 4096, {"n96": (1.02, True), "pp": (0.98, False)}),
                           ("mha64c", 3000, {"n96": (1.09, True), "pp": (1.0, False)})]),
               _record(b, [("mha64c", 2048, {"x": (1.04, True)}),            # the same change, named otherwise
                           ("mha64c", 4096, {"x": (1.01, False)}),
                           ("mha64c", 3000, {"x": (1.09, True)})])]
    chosen, notes = bt.choose(bt.collect(records))
    assert {k: c for k, (c, _) in chosen.items()} == {("mha64c", "s2048"): {"block_n": 96}}   # pp: one process
    assert any("s2048" in n and "pingpong" in n and "1 of 1" in n for n in notes)
    assert any("s4096" in n and "1 of 2" in n for n in notes)
    assert any("3000: not a bucket edge" in n for n in notes)
    assert bt.choose(bt.collect(records), min_processes=1)[0][("mha64c", "s2048")][0] == {"pingpong": True}


def test_more_processes_add_evidence_and_a_slower_one_vetoes():
    bt = _table_script()
    ch = {"n96": {"block_n": 96}}

    def proc(ratio, confirmed):
        return _record(ch, [("mha64c", 4096, {"n96": (ratio, confirmed)})])

    inconclusive = [proc(1.03, True), proc(1.004, False), proc(1.02, True)]
    assert ("mha64c", "s4096") in bt.choose(bt.collect(inconclusive))[0]      # two confirm, none slower
    slower = [proc(1.03, True), proc(0.99, False), proc(1.02, True)]
    chosen, notes = bt.choose(bt.collect(slower))
    assert not chosen and "won in 2 of 3" in notes[0]


def test_the_best_median_ratio_wins_and_entries_merge_buckets_and_variants():
    bt = _table_script()
    ch = {"m128": {"block_m": 128, "num_warps": 8}, "n96": {"block_n": 96}}
    rows = [(spec, s, {"m128": (1.10, True), "n96": (1.04, True)})
            for spec in ("mha64c", "mqa64c") for s in (512, 1024)]
    rows += [("mha64c", 2048, {"m128": (0.97, False), "n96": (1.03, True)})]
    chosen, _ = bt.choose(bt.collect([_record(ch, rows), _record(ch, rows)]))
    items = bt.entries(chosen)
    assert [(e["variants"], e["buckets"], e["change"]) for e in items] == [
        (["mha", "mqa"], ["s512", "s1024"], {"block_m": 128, "num_warps": 8}),
        (["mha"], ["s2048"], {"block_n": 96})]
    assert items[0]["measured"] == ("MHA s512 x1.100 x1.100, s1024 x1.100 x1.100; "
                                    "MQA s512 x1.100 x1.100, s1024 x1.100 x1.100")
    parsed = parse_table(tomllib.loads(bt.to_toml(items)), "derived")
    assert bt.differences(bt.assignments(bt.as_table(items)), bt.assignments(parsed)) == []


def test_the_h100_table_is_what_its_records_give(capsys):
    bt = _table_script()
    files = sorted((RECORDS / "h100").glob("*.json"))
    assert len(files) == 44
    assert bt.main([*map(str, files), "--check", "h100"]) == 0
    assert "h100: matches the 44 records" in capsys.readouterr().out
    # one entry edited by hand, and the check names it
    table = bt.assignments(load_table("h100"))
    table[("mha", 64, True, "s4096")] = {"block_n": 112}
    derived = bt.assignments(bt.as_table(bt.entries(bt.choose(bt.collect([json.loads(f.read_text())
                                                                            for f in files]))[0], H100)))
    assert bt.differences(derived, table) == [
        "('mha', 64, True, 's4096'): records give {'block_n': 96, 'rescale_threshold': 8}, the table has {'block_n': 112}"]


def test_timings_of_a_superseded_ping_pong_kernel_do_not_count():
    """A record without pingpong_revision (or an older one) timed the revision-1 ping-pong, which the translator
    no longer builds: its ping-pong changes are left out, its other changes count as before."""
    bt = _table_script()
    ch = {"pp": {"pingpong": True}, "n96": {"block_n": 96}}
    rows = [("mha64n", 2048, {"pp": (1.04, True), "n96": (1.02, True)})]
    old, new = _record(ch, rows, pingpong_revision=None), _record(ch, rows)
    assert bt.choose(bt.collect([old, old]))[0][("mha64n", "s2048")][0] == {"block_n": 96}
    assert bt.choose(bt.collect([new, new]))[0][("mha64n", "s2048")][0] == {"pingpong": True}
    slower_old = _record(ch, [("mha64n", 2048, {"pp": (0.95, False), "n96": (1.02, True)})], pingpong_revision=1)
    assert bt.choose(bt.collect([new, new, slower_old]))[0][("mha64n", "s2048")][0] == {"pingpong": True}


def test_a_change_re_timed_against_the_current_default_drops_its_older_timings():
    """kernel_revision: once a change was timed against the current (faster) default at a point, its timings against
    the earlier default no longer count there; a change not re-timed keeps its older records."""
    bt = _table_script()
    ch = {"pp": {"pingpong": True}, "n96": {"block_n": 96}}
    old = _record(ch, [("mha64n", 2048, {"pp": (1.05, True), "n96": (1.02, True)})])   # no field: revision 1
    new = {**_record({"pp": ch["pp"]}, [("mha64n", 2048, {"pp": (1.004, False)})]), "kernel_revision": 2}
    collected = bt.collect([old, old, new, new])
    assert len(collected[("mha64n", 2048)]['{"pingpong": true}']) == 2          # only the re-timed ones
    assert len(collected[("mha64n", 2048)]['{"block_n": 96}']) == 2             # not re-timed: kept
    assert bt.choose(collected)[0][("mha64n", "s2048")][0] == {"block_n": 96}
    assert bt.choose(bt.collect([old, old]))[0][("mha64n", "s2048")][0] == {"pingpong": True}


def test_bucket_table_refuses_a_record_of_the_old_single_change_form(tmp_path, capsys):
    bt = _table_script()
    (tmp_path / "old.json").write_text(json.dumps({"change": {"block_n": 96}, "rows": []}))
    assert bt.main([str(tmp_path / "old.json")]) == 2
    assert "not a param_ab_check --changes record" in capsys.readouterr().err


def test_an_earlier_translators_kernel_is_not_a_change_of_the_table():
    """param_ab_check --before times the previous translator's kernel as 'before': a record keeps its verdicts,
    and the table's rule leaves them out (it is no parameter change of the default)."""
    bt = _table_script()
    ch = {"pk": {"pack_gqa": True}}
    rows = [("mqa64c", 512, {"pk": (1.30, True), "before": (1.05, True)})]
    chosen, _ = bt.choose(bt.collect([_record(ch, rows), _record(ch, rows)]))
    assert [e["change"] for e in bt.entries(chosen)] == [{"pack_gqa": True}]


def test_param_ab_check_finds_each_specs_earlier_kernel_in_a_build_folder(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import param_ab_check as ab

    from tuner.defaults.table import parse_spec_label

    specs = [("mqa64c", parse_spec_label("mqa64c")), ("gqa128c", parse_spec_label("gqa128c"))]
    spec = {"variant": "mqa", "d_qk": 64, "d_v": 64, "causal": True, "dtype": "bf16", "layout": "dense",
            "phase": "prefill"}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "k1.json").write_text(json.dumps({"name": "k1", "spec": spec, "meta": {"m": 1}}))
    (tmp_path / "a" / "k1.cubin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="no `tune build` output for gqa128c"):
        ab.load_before(tmp_path, specs)
    found = ab.load_before(tmp_path, specs[:1])
    assert found["mqa64c"][0] == "k1" and found["mqa64c"][2] == {"m": 1}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "k2.json").write_text(json.dumps({"name": "k2", "spec": spec, "meta": {}}))
    (tmp_path / "b" / "k2.cubin").write_bytes(b"\0")
    with pytest.raises(ValueError, match="two kernels for mqa64c"):
        ab.load_before(tmp_path, specs[:1])
