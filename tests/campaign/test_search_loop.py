"""The search bar in the campaign loop, on the session's fake-GPU Ray cluster with the replay backend: --trials
counts measured candidates only, the lookahead is bounded, the measurement cache answers what was measured
(within a study and across the studies of a study dir) unless --remeasure, several combinations share one
run fairly, and a model preset expands to its own shapes."""
import json
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tuner.campaign import run_campaign
from tuner.campaign.study import make_storage

from .conftest import STUDY, load_study, paced_grid, replay_options

pytestmark = pytest.mark.slow


def options(study_dir, **changes):
    return replay_options(study_dir, **{"trials": 6, **changes})


load = load_study


def measured(study):
    """Trials that took a GPU: measured (or failed there) in this study."""
    return [t for t in study.trials if t.user_attrs.get("gpu_lock") or t.user_attrs.get("pid")]


def counted(study):
    """What --trials counts: finished, neither answered from the cache nor refused before compiling."""
    return [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and not t.user_attrs.get("cache_hit") and t.user_attrs.get("stage") != "validate"]


def test_cache_answers_what_a_study_of_the_dir_measured_and_remeasure_measures_again(ray_cluster, tmp_path):
    assert run_campaign(options(tmp_path, trials=6)) == 0
    first = load(tmp_path)
    keys_first = {t.user_attrs["measurement_key"]: t.number for t in measured(first)}
    assert len(keys_first) == len(measured(first)) >= 6          # never the same kernel measured twice
    # A second study in the same study dir (its own storage): the seeds were measured by the first.
    other = str(tmp_path / "second.journal")
    assert run_campaign(options(tmp_path, trials=6, storage=other)) == 0
    second = load(tmp_path, storage=make_storage(other, tmp_path, STUDY))
    hits = [t for t in second.trials if t.user_attrs.get("cache_hit")]
    assert hits, "the second study re-proposed nothing the first had measured"
    for t in hits:
        assert not t.user_attrs.get("gpu_lock") and not t.user_attrs.get("pid")   # no GPU, no compile
        assert t.user_attrs["cached_from"]["study"] == STUDY
        assert keys_first[t.user_attrs["measurement_key"]] == t.user_attrs["cached_from"]["trial"]
        if t.state == TrialState.COMPLETE:
            original = first.trials[t.user_attrs["cached_from"]["trial"]]
            assert t.value == original.value and t.user_attrs["tflops"] == original.user_attrs["tflops"]
    assert len(counted(second)) == 6                             # hits did not use up its --trials
    keys_second = [t.user_attrs["measurement_key"] for t in measured(second)]
    assert not set(keys_second) & set(keys_first) and len(set(keys_second)) == len(keys_second)
    summary = json.loads((tmp_path / STUDY / "summary.json").read_text())
    assert summary["trials"]["cache_hits"] == len(hits)
    # --remeasure: the same seeds measured again on the GPU
    third = str(tmp_path / "third.journal")
    assert run_campaign(options(tmp_path, trials=3, storage=third, remeasure=True)) == 0
    again = load(tmp_path, storage=make_storage(third, tmp_path, STUDY))
    assert not [t for t in again.trials if t.user_attrs.get("cache_hit")]
    assert {t.user_attrs["measurement_key"] for t in measured(again)} & set(keys_first)


def test_sets_refused_before_compiling_do_not_use_up_the_trials(ray_cluster, tmp_path):
    from .conftest import campaign_seed_keys

    first = len(campaign_seed_keys()[0]) + 1
    assert run_campaign(options(tmp_path, trials=first)) == 0   # past the seeds: the queue is empty
    study = load(tmp_path)
    study.enqueue_trial({"schedule": "no_such_sketch"})      # e.g. an old seed the space no longer holds
    assert run_campaign(options(tmp_path, trials=first + 2, resume=True)) == 0
    study = load(tmp_path)
    refused = [t for t in study.trials if t.user_attrs.get("stage") == "validate"]
    assert len(refused) == 1 and "no_such_sketch" in refused[0].user_attrs["infeasible_reason"]
    assert len(counted(study)) == first + 2
    summary = json.loads((tmp_path / STUDY / "summary.json").read_text())
    assert summary["trials"]["rejected_before_compile"] == 1


def test_lookahead_is_bounded_and_a_timeout_leaves_few_compiled_unmeasured(ray_cluster, tmp_path):
    replay = paced_grid(tmp_path / "paced.jsonl", 0.4)
    assert run_campaign(options(tmp_path / "s", backend=f"replay:{replay}", trials=400, timeout=14.0,
                                gpu_overlap=2)) == 0
    study = load(tmp_path / "s")
    gpu_slots = 2 * 2                                   # 2 fake GPUs x --gpu-overlap 2
    ahead = [t.user_attrs["asked_ahead"] for t in study.trials if "asked_ahead" in t.user_attrs]
    # the fake compile is instant: the pacing floor holds (2 x slots waiting, plus the 2 compile slots of this
    # 2-CPU cluster before the first measurement) and the slots on the GPUs
    assert ahead and max(ahead) <= 3 * gpu_slots + 2, max(ahead)
    summary = json.loads((tmp_path / "s" / STUDY / "summary.json").read_text())
    assert summary["trials"]["compiled_unmeasured_at_stop"] <= 2 * gpu_slots
    assert summary["trials"]["measured_this_run"] >= 8
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_several_combinations_share_one_run_fairly_report_once_and_resume_together(ray_cluster, tmp_path):
    from tuner.store.export import run_export

    opts = options(tmp_path, variant="mha,gqa", causal="both", trials=3)
    assert run_campaign(opts) == 0
    names = ["h100-mha-bf16-d128-causal", "h100-mha-bf16-d128-noncausal", "h100-gqa-bf16-d128-causal",
             "h100-gqa-bf16-d128-noncausal"]
    for name in names:
        assert len(counted(load(tmp_path, name))) == 3, name
    report = (tmp_path / "campaign-h100.md").read_text()
    assert all(f"Study `{n}`" in report for n in names) and report.count("| shape | ours |") == 4
    assert report.count("| bucket | best single (TFLOPS) |") == 4          # each combination's re-timed winners
    out = tmp_path / "exported"
    assert run_export(gpu="h100", variant=None, study_dir=tmp_path, out_dir=out) == 0
    configs = sorted(p.name for p in out.rglob("*.json") if "device_name" in p.name)
    assert any("variant=mha" in c and "causal=0" in c for c in configs)
    assert any("variant=gqa" in c and "causal=1" in c for c in configs)
    assert run_campaign(options(tmp_path, variant="mha,gqa", causal="both", trials=4, resume=True)) == 0
    for name in names:
        assert len(counted(load(tmp_path, name))) == 4, name


def test_a_model_preset_tunes_its_own_heads(ray_cluster, tmp_path):
    assert run_campaign(options(tmp_path, variant=None, model="llama3-8b", trials=3)) == 0
    study = load(tmp_path, "h100-gqa-bf16-d128-causal-32q8kv")
    assert len(counted(study)) == 3
    summary = json.loads((tmp_path / "h100-gqa-bf16-d128-causal-32q8kv" / "summary.json").read_text())
    assert summary["combination"] == "gqa d128 bf16 causal (llama3-8b, 32q/8kv)"
    from tuner.store.records import KernelStore

    records = KernelStore(tmp_path).records(gpu="h100", variant="gqa")
    assert records and all(r.problem["heads_q"] == 32 and r.problem["heads_kv"] == 8 for r in records)
    assert all(r.sketch for r in records)


def test_the_llm_sketch_variants_are_a_choice_of_the_study_and_a_resume_keeps_them(ray_cluster, tmp_path):
    """With an endpoint, the LLM's checked schedule variant joins the built-in sketches as a value of the
    study's `schedule` dimension, kept in the study; --resume searches the same sketches without asking."""
    import sys

    import tl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
    from stub_server import Reply, StubOpenAI

    lines = tl.load_sketch("mha", True, "fa2").splitlines()
    v_copy = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Copy V"))
    gemm = next(i for i, ln in enumerate(lines) if "K_shared.T and get S" in ln)
    moved = lines[:gemm] + [lines[v_copy]] + [ln for i, ln in enumerate(lines[gemm:], gemm) if i != v_copy]
    variant = "\n".join(moved) + "\n"                       # V's copy issued before the score GEMM
    assert tl.check_source(variant, "<variant>")[1] == []
    seeds = {"candidates": [{"block_m": 128, "block_n": 64, "num_warps": 4, "kv_stages": 1,
                             "mma_atom": "SM80_16x8x16", "g2s_atom": "SM80_CP_ASYNC_CACHEGLOBAL",
                             "s2r_atom": "SM75_U32x4_LDSM_N", "swizzle": 3, "q_in_regs": False,
                             "rationale": "FA2's tile"}]}
    script = [Reply("```tl\n" + variant + "```\nV first."), Reply("```tl\n" + variant + "```"),
              Reply(json.dumps(seeds))]
    with StubOpenAI(script=script) as stub:
        llm = dict(llm_base_url=stub.base_url, llm_model="stub-model", llm_api_key="sk-test", llm_sketches=1)
        assert run_campaign(options(tmp_path, trials=3, **llm)) == 0
        sent = len(stub.chat_requests)
        study = load(tmp_path)
        sketches = {s["name"]: s for s in study.user_attrs["sketches"]}
        assert sketches["llm-1"]["source"] == "llm" and sketches["llm-1"]["base"] == "fa2"
        assert tl.format_program(tl.parse_program(sketches["llm-1"]["text"])) == \
            tl.format_program(tl.parse_program(variant))
        assert "variant 1 of 1" in stub.chat_requests[0].text.lower()   # the prompt asks for a schedule variant
        choices = {c for t in study.trials for name, d in t.distributions.items() if name.startswith("schedule")
                   for c in d.choices}
        assert {"ws_overlap", "ws_serial", "fa2", "fa2_late_prefetch", "llm-1"} <= choices
        assert run_campaign(options(tmp_path, trials=5, resume=True, **llm)) == 0
        assert len(stub.chat_requests) == sent                  # resumed: the study's sketches, the cached seeds
        assert [s["name"] for s in load(tmp_path).user_attrs["sketches"]] == list(sketches)
        assert stub.failures == []


def test_at_the_stop_kernels_compiling_or_waiting_are_queued_again_with_the_reason():
    """The requeue of loop._leftovers, deterministically (the e2e --timeout test may stop with none in flight)."""
    from collections import deque
    from types import SimpleNamespace

    import optuna

    from tuner.campaign.state import Candidate, Tally
    from tuner.campaign.loop import Loop

    study = optuna.create_study(direction="maximize")
    camp = SimpleNamespace(study=study, tally=Tally(), inflight=2)
    filling, ready = study.ask({"block_n": optuna.distributions.CategoricalDistribution([64, 128])}), \
        study.ask({"block_n": optuna.distributions.CategoricalDistribution([64, 128])})
    loop = Loop.__new__(Loop)
    loop.stop_reason, loop.workers = "the --timeout budget ran out", None
    loop.compiling, loop.compile_node, loop.measuring = {}, {}, {}
    loop.filling = {"c": ([Candidate(camp, filling, None, "ws_overlap", "k1")], 0.0)}
    loop.ready, loop.waiting = deque([Candidate(camp, ready, None, "ws_overlap", "k2")]), {}
    loop.console = SimpleNamespace(print=lambda *a, **k: None)
    loop._leftovers()
    trials = study.get_trials(deepcopy=False)
    cut = [t for t in trials if t.state == TrialState.FAIL]
    assert {t.number for t in cut} == {filling.number, ready.number}
    assert all(t.user_attrs["infra_failure"] == "not finished: the --timeout budget ran out" for t in cut)
    queued = [t.system_attrs["fixed_params"] for t in trials if t.state == TrialState.WAITING]
    assert sorted(q["block_n"] for q in queued) == sorted(t.params["block_n"] for t in cut)   # queued for --resume
    assert camp.tally.failed == 2 and camp.tally.unmeasured == 1 and camp.inflight == 0
    assert not loop.ready and not loop.filling
