"""A decode campaign: `--phase decode` searches the decode space (search_spaces/decode/) over the decode
sketches, measures one decode call per decode bucket, decides and stores per decode bucket, and refuses bad
input with reasons."""
import json

import pytest

from hardware_profiles import load_profile
from tuner.campaign import CampaignOptions, run_campaign
from tuner.campaign.combos import ComboError, expand_combinations
from tuner.campaign.options import option_problems
from tuner.campaign.study import study_name
from tuner.serving.buckets.decode import decode_bucket, decode_bucket_errors, parse_decode_bucket

from .conftest import load_study, replay_options


def test_decode_options_are_checked_with_reasons():
    def problems(**kw):
        return " ".join(option_problems(CampaignOptions(gpu="h100", variant="gqa", phase="decode", **kw)))

    assert "reads a paged or a dense KV cache, not --layout varlen" in problems(layout="varlen")
    assert "--page-size must be one of 16, 32, 64, 128, 256" in problems(layout="paged", page_size=24)
    assert "--page-size applies to a paged cache" in problems(layout="dense", page_size=16)
    assert "--seqlens sets the prefill grid" in problems(layout="paged", page_size=16, seqlens=(512,))
    assert "--phase must be prefill, decode or all" in " ".join(option_problems(CampaignOptions(gpu="h100", variant="gqa",
                                                                                           phase="append")))
    assert problems(layout="paged", page_size=64) == "" and problems(layout="dense") == ""


def test_the_decode_bucket_rule_reads_shapes_only():
    assert decode_bucket(1, 1000, 16) == "d-b1-kv2k-p16"
    assert decode_bucket(5, 8192, None) == "d-b8-kv8k"
    assert decode_bucket(500, 100_000, 64) == "d-b128-kv32k-p64"      # past the last edges: the last class
    assert parse_decode_bucket("d-b32-kv8k-p16") == (32, 8192, 16)
    assert decode_bucket_errors("d-b32-kv8k", "paged") and decode_bucket_errors("d-b32-kv8k-p16", "dense")
    assert decode_bucket_errors("d-b33-kv8k", "dense") and not decode_bucket_errors("d-b32-kv8k", "dense")
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        decode_bucket(0, 10)


def test_a_model_preset_asks_for_decode_and_gets_one_call_per_bucket():
    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, "llama3-8b", "paged", 16, "decode")
    spec = combo.spec()
    assert (spec.phase, spec.layout, spec.d_qk, combo.heads) == ("decode", "paged", 128, (32, 8))
    problems = combo.problems()
    assert len(problems) == 12 and len({p.bucket for p in problems}) == 12
    assert all(p.bucket.endswith("-p16") and (p.heads_q, p.heads_kv) == (32, 8) for p in problems)
    big = max(problems, key=lambda p: p.flops)
    assert (big.batch, big.kv_len, big.bucket) == (128, 32768, "d-b128-kv32k-p16")
    assert big.kv_bytes == 128 * 32768 * 8 * 256 * 2
    assert study_name("h100", spec, heads=combo.heads, page_size=16) == \
        "h100-gqa-bf16-d128-causal-32q8kv-paged16-decode"
    (mla,) = expand_combinations(load_profile("h100"), None, None, None, None, "deepseek-v3", "paged", 64, "decode")
    assert (mla.spec().d_qk, mla.spec().d_v, mla.decode_heads()) == (576, 512, (128, 1))
    assert "absorbed" in mla.label()
    with pytest.raises(ComboError, match="needs an sm80"):
        expand_combinations(load_profile("t4"), "gqa", None, None, None, None, "paged", 16, "decode")


def test_the_decode_space_holds_only_kernels_validate_decode_accepts():
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space
    from translate.decode import DecodeParams, validate_decode

    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, "llama3-8b", "paged", 16, "decode")
    space = load_space("gqa", phase="decode")
    assert space.phase == "decode" and space.params_class() is DecodeParams
    feasible = feasible_space(space, load_profile("h100"), 128, "bf16", combo.shapes(),
                              (("decode", "decode"), ("decode_late", "decode_late")), "paged", 16)
    assert 0 < len(feasible.points) < feasible.enumerated
    assert {p.sketch for p in feasible.points} == {"decode", "decode_late"}
    assert all(not validate_decode(p.params, load_profile("h100"), combo.spec()) for p in feasible.points)
    chosen, why = feasible.project({"schedule": "decode", **DecodeParams(block_n=32, warps_n=4).to_dict()},
                                   load_profile("h100"), 128, "bf16", combo.shapes())
    assert not chosen and "block_n 32 must be a positive multiple of 16 x warps_n" in " ".join(why)


def test_phi3_minis_decode_space_at_head_dim_96_takes_the_2_bit_swizzle():
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space
    from translate.decode import validate_decode

    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, "phi3-mini", "paged", 16, "decode")
    assert (combo.spec().d_qk, combo.spec().features) == (96, ("local",))
    space = load_space("mha", phase="decode")
    feasible = feasible_space(space, load_profile("h100"), 96, "bf16", combo.shapes(),
                              (("decode", "decode"), ("decode_late", "decode_late")), "paged", 16)
    assert feasible.points and {p.params.swizzle for p in feasible.points} == {2}
    assert all(not validate_decode(p.params, load_profile("h100"), combo.spec()) for p in feasible.points)


def test_decode_sketches_load_by_schedule_and_cache():
    import tl

    late = tl.load_sketch("gqa", True, "decode_late", "dense")
    assert "split_begin:split_end" in late and "page_table" not in late
    assert "page_table" in tl.load_sketch("mqa", False, "decode", "paged")
    with pytest.raises(ValueError, match="unknown decode schedule"):
        tl.decode_sketch_path("gqa", "decode_early", "paged")
    with pytest.raises(ValueError, match="paged or a dense cache, not 'varlen'"):
        tl.decode_sketch_path("gqa", "decode", "varlen")


@pytest.mark.slow
def test_a_decode_campaign_measures_each_bucket_and_stores_decode_records(ray_cluster, tmp_path):
    from tuner.store.records import KernelStore

    rc = run_campaign(replay_options(tmp_path, trials=8, variant="gqa", phase="decode", layout="paged",
                                     page_size=16))
    assert rc == 0
    name = "h100-gqa-bf16-d128-causal-paged16-decode"
    study = load_study(tmp_path, name)
    keys = {f"b{b}-kv{kv}k" for b in (1, 8, 32, 128) for kv in (2, 8, 32)}
    measured = [t for t in study.trials if t.user_attrs.get("tflops") and not t.user_attrs.get("early_stop")]
    assert measured and all(set(t.user_attrs["tflops"]) == keys for t in measured)
    assert {t.user_attrs["schedule"] for t in study.trials if t.user_attrs.get("schedule")} <= {"decode",
                                                                                                  "decode_late"}
    assert all("min_split_blocks" in t.user_attrs["kernel_params"] for t in study.trials
               if t.user_attrs.get("kernel_params"))
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert {w["bucket"] for w in summary["winners"]} == {f"d-b{b}-kv{kv}k-p16" for b in (1, 8, 32, 128)
                                                          for kv in (2, 8, 32)}
    records = KernelStore(tmp_path).records(variant="gqa")
    assert records and all(r.phase == "decode" and r.layout == "paged" and r.bucket.startswith("d-b")
                           for r in records)
    assert all(r.problem["phase"] == "decode" and r.problem["kv_bytes"] > 0 for r in records)


@pytest.mark.parametrize("variant,hq,hkv,d_qk,d_v,sq,page", [("gqa", 8, 2, 64, 64, 3, 16), ("mla", 4, 1, 576, 512, 2, 0)])
def test_the_cross_check_at_size_matches_a_head_by_head_reference_and_catches_a_wrong_output(variant, hq, hkv, d_qk,
                                                                                              d_v, sq, page):
    import torch

    from tuner.measure.decode import make_decode_inputs, make_mla_inputs
    from tuner.measure import decode as dm
    from tuner.measure.trial import BENCH_CROSS_CHECK_REL_ERR
    from tuner.measure.decode_problem import DecodeProblem

    prob = DecodeProblem(variant, 3, 70, hq, hkv, d_qk, d_v, True, "fp16", seqlen_q=sq, page_size=page)
    x = ({**make_mla_inputs(prob.point(), device="cpu"), "v": None} if variant == "mla"
         else make_decode_inputs(prob.point(), device="cpu"))
    out = torch.zeros(prob.batch, sq, hq, d_v)
    for i in range(prob.batch):   # one head and token at a time, the causal diagonal bottom-right
        k, v = dm._sequence_kv(x, prob, i, "k").float(), dm._sequence_kv(x, prob, i, "v").float()
        for h in range(hq):
            for t in range(sq):
                s = (x["q"][i, t, h].float() @ k[:, h // (hq // hkv)].T) * prob.softmax_scale
                s[t + prob.kv_len - sq + 1:] = float("-inf")
                out[i, t, h] = torch.softmax(s, -1) @ v[:, h // (hq // hkv)]
    assert dm.cross_check(out, x, prob) < 1e-5
    out[prob.batch - 1, sq - 1, hq - 1, 0] += 1.0     # the last sequence's last row: where offsets are largest
    assert dm.cross_check(out, x, prob) > BENCH_CROSS_CHECK_REL_ERR


@pytest.mark.slow
def test_deepseek_v3_decodes_absorbed_mla_in_its_campaign(ray_cluster, tmp_path):
    from tuner.store.records import KernelStore

    rc = run_campaign(replay_options(tmp_path, trials=4, variant=None, model="deepseek-v3", phase="decode",
                                     layout="paged", page_size=64))
    assert rc == 0
    (record, *_) = KernelStore(tmp_path).records(variant="mla")
    assert (record.d_qk, record.d_v, record.phase, record.bucket[-4:]) == (576, 512, "decode", "-p64")
    assert record.problem["heads_q"] == 128 and record.problem["heads_kv"] == 1
    assert record.baselines.get("fa4") is None    # FA4 has no absorbed MLA: the copy bound is the yardstick
