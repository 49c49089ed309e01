"""The whole campaign loop on a real local Ray cluster (fake GPUs) with the replay backend: search,
journal storage, planted faults, store, export, resume, pinning to the accelerator type, kill -9."""
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from tuner.campaign import run_campaign

from .conftest import (GRID, REPO, STUDY, campaign_seed_keys, load_study, paced_grid, replay_options, start_node,
                       wait_for_node, write_replay)

pytestmark = pytest.mark.slow


def options(study_dir, **changes):
    return replay_options(study_dir, **changes)


load = load_study


def test_unknown_gpu_variant_and_dtype_list_the_choices(capsys):
    assert run_campaign(options("/nonexistent", gpu="b200")) == 2
    assert "unknown GPU 'b200'; choose one of: a100, h100, h200, l40s, rtx8000, t4" in capsys.readouterr().err
    assert run_campaign(options("/nonexistent", variant="mxa")) == 2
    assert "unknown variant 'mxa'; choose from: mha, gqa, mqa, mla" in capsys.readouterr().err
    assert run_campaign(options("/nonexistent", gpu="t4", dtype="bf16")) == 2
    assert "t4 does not support bf16; choose one of: fp16" in capsys.readouterr().err


@pytest.fixture(scope="module")
def faulty_run(ray_cluster, tmp_path_factory):
    """One campaign whose seeds include an out-of-bounds kernel, a hang, a wrong result and a compile error."""
    root = tmp_path_factory.mktemp("faulty")
    keys, by_key = campaign_seed_keys()
    assert len(keys) >= 5, keys
    faults = {keys[1]: (by_key[keys[1]], "oob"), keys[2]: (by_key[keys[2]], "hang"),
              keys[3]: (by_key[keys[3]], "wrong"), keys[4]: (by_key[keys[4]], "compile")}
    replay = write_replay(root / "replay.jsonl", faults)
    started = time.monotonic()
    rc = run_campaign(options(root / "studies", backend=f"replay:{replay}", trial_timeout=8.0))
    return {"rc": rc, "root": root, "keys": keys, "faults": {k: f for k, (_, f) in faults.items()},
            "replay": replay, "seconds": time.monotonic() - started}


def test_planted_faults_are_infeasible_with_reasons_and_the_campaign_completes(faulty_run):
    assert faulty_run["rc"] == 0
    study = load(faulty_run["root"] / "studies")
    by_key = {t.user_attrs.get("params_key"): t for t in study.trials}
    expect = {"oob": "crash: the trial's process died of SIGSEGV", "hang": "timeout: no result after 8 s",
              "wrong": "wrong result", "compile": "compile error"}
    for key, fault in faulty_run["faults"].items():
        t = by_key[key]
        assert t.state == TrialState.PRUNED, (fault, t.state)
        assert t.constraints == {"infeasible": 1.0} and t.user_attrs["constraint"] == [1.0]
        assert expect[fault] in t.user_attrs["infeasible_reason"], (fault, t.user_attrs["infeasible_reason"])
    finished = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 14 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 5
    for t in complete:  # per-shape numbers, where it ran, and a fresh process per trial
        assert set(t.user_attrs["tflops"]) == {"512", "1024", "2048", "4096", "8192", "16384"}
        assert t.user_attrs["verification"]["passed"] is True and t.user_attrs["constraint"] == [0.0]
    assert len({t.user_attrs["pid"] for t in complete}) == len(complete)
    # Seeds went first, with their source.
    assert [t.user_attrs["params_key"] for t in study.trials[:5]] == faulty_run["keys"][:5]
    assert all(t.user_attrs["source"] for t in study.trials[:5])


def test_best_kernels_are_stored_per_bucket_and_exported(faulty_run, tmp_path):
    from tuner.store.export import run_export
    from tuner.store.records import KernelStore

    study_dir = faulty_run["root"] / "studies"
    study = load(study_dir)
    records = KernelStore(study_dir).records(gpu="h100", variant="mha")
    assert sorted(r.bucket for r in records) == ["s1024", "s16384", "s2048", "s4096", "s512", "s8192"]
    for r in records:
        seqlen = r.bucket[1:]
        best = max((t for t in study.trials if t.state == TrialState.COMPLETE),
                   key=lambda t: t.user_attrs["tflops"][seqlen])
        assert r.tflops == best.user_attrs["tflops"][seqlen] and r.trial == best.number
        assert r.verification["passed"] is True and r.provenance["backend"].startswith("replay")
        assert r.baselines["flash"] > 0 and r.device_name == "NVIDIA H100 80GB HBM3"
        assert r.baselines["fa4"] is None        # the replay grid holds no FA4 numbers: none, never a 0
    # ... and the report and the summary say why, as the study keeps it for a resumed run
    assert study.user_attrs["baselines"]["errors"]["512"] == {"fa4": "not recorded in the replay file"}
    report = (study_dir / STUDY / "report.md").read_text()
    assert "- FA4 (causal s512, causal s1024, causal s2048, causal s4096, causal s8192, causal s16384): " \
           "not recorded in the replay file" in report
    summary = json.loads((study_dir / STUDY / "summary.json").read_text())
    for row in summary["rows"]:
        assert row["fa4"] is None and row["fa4_err"] == "not recorded in the replay file"
        assert row["ratios"]["fa4"] is None and row["ratios"]["flash"] > 0
    assert run_export(gpu="h100", variant="mha", study_dir=study_dir, out_dir=tmp_path / "out") == 0
    doc = json.loads((tmp_path / "out" / "variant=mha,head_dim=128,dtype=bf16,causal=1,"
                                        "device_name=NVIDIA_H100_80GB_HBM3.json").read_text())
    by_bucket = {r.bucket: r for r in records}
    assert sorted(k for k in doc if k != "_metadata") == sorted(by_bucket)
    for bucket, entry in doc.items():
        if bucket != "_metadata":
            assert entry["params"] == by_bucket[bucket].params


def test_a_replay_grid_is_recorded_from_the_campaign_journal(faulty_run, tmp_path):
    """scripts/grid_from_studies.py: the verified trials of a journal become a replay grid that the
    replay backend loads, one entry per parameter set, and a campaign can replay."""
    from tuner.campaign.backends import load_replay

    journal = faulty_run["root"] / "studies" / f"{STUDY}.journal"
    out = tmp_path / "grid.jsonl.gz"
    proc = subprocess.run([sys.executable, "scripts/grid_from_studies.py", str(out), str(journal)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grid = load_replay(out)
    verified = [t for t in load(faulty_run["root"] / "studies").trials if t.state == TrialState.COMPLETE]
    assert set(grid.entries) == {t.user_attrs["params_key"] for t in verified}
    for t in verified:   # the recorded grid was itself a replay: the numbers come back unchanged
        assert grid.entries[t.user_attrs["params_key"]]["tflops"] == t.user_attrs["tflops"]
    assert grid.meta["device_name"] == "NVIDIA H100 80GB HBM3" and grid.meta["baselines"]["1024"]["flash"] > 0
    bad = subprocess.run([sys.executable, "scripts/grid_from_studies.py"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "grid_from_studies.py OUT.jsonl.gz" in bad.stderr


def test_existing_study_without_resume_is_refused(faulty_run, capsys):
    rc = run_campaign(options(faulty_run["root"] / "studies", backend=f"replay:{faulty_run['replay']}"))
    assert rc == 2
    out = capsys.readouterr().err
    assert "already exists" in out and "--resume" in out and "--study-dir" in out


def test_resume_keeps_completed_trials_and_does_not_enqueue_seeds_again(faulty_run):
    study_dir = faulty_run["root"] / "studies"
    before = {t.number: (t.state, t.value) for t in load(study_dir).trials}
    rc = run_campaign(options(study_dir, backend=f"replay:{faulty_run['replay']}", trials=18, resume=True))
    assert rc == 0
    after = load(study_dir).trials
    assert {t.number: (t.state, t.value) for t in after if t.number in before} == before
    assert len([t for t in after if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 18
    seeded = [t for t in after if t.user_attrs.get("source")]
    assert len(seeded) >= 5 and all(t.number in before for t in seeded), "seeds enqueued twice"


def test_timeout_stops_the_campaign_and_queues_unfinished_trials(ray_cluster, tmp_path):
    # Each trial holds its GPU 0.5 s: 200 trials cannot finish in the 8-s budget. Near the end the pacer
    # compiles only what the GPUs can still measure (pacing.Pacer.room), so whether any kernel is still
    # compiling or waiting at the stop depends on how well it estimated (a loaded 2-core CI machine: none);
    # whatever was cut is queued again with the reason, and nothing is left running.
    replay = paced_grid(tmp_path / "paced.jsonl", 0.5)
    started = time.monotonic()
    assert run_campaign(options(tmp_path / "s", trials=200, timeout=8.0, backend=f"replay:{replay}")) == 0
    assert time.monotonic() - started < 40
    study = load(tmp_path / "s")
    measured = [t for t in study.trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("cache_hit")]
    assert 0 < len(measured) < 200                                   # the budget stopped it, not --trials
    cut = [t for t in study.trials if t.state == TrialState.FAIL]
    assert all("not finished: the --timeout budget ran out" in t.user_attrs["infra_failure"] for t in cut)
    queued = [t for t in study.trials if t.state == TrialState.WAITING]
    assert len(queued) >= len(cut)            # seeds not yet asked, plus every cut trial's parameters
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_no_t4_in_the_cluster_is_an_error_naming_the_types_present(ray_cluster, tmp_path, capsys):
    rc = run_campaign(options(tmp_path, gpu="t4"))
    out = capsys.readouterr().err
    assert rc == 2
    assert "no T4 GPU" in out and "H100 (2 GPUs)" in out and "--dry-run" in out


def test_t4_trials_land_on_the_t4_node_only(ray_cluster, tmp_path):
    node = start_node(ray_cluster, "T4")
    try:
        t4_node = wait_for_node("T4")
        rc = run_campaign(options(tmp_path, gpu="t4", trials=5, trial_timeout=30.0))
        assert rc == 0
        study = load(tmp_path, "t4-mha-fp16-d128-causal")
        measured = [t for t in study.trials if "node_id" in t.user_attrs]
        assert len(measured) >= 3
        assert {t.user_attrs["node_id"] for t in measured} == {t4_node}
        assert all(t.user_attrs["replay_unknown"] for t in measured)  # the h100 grid has no sm75 entries
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=60)


def test_kill_minus_9_then_resume_loses_no_completed_trial(ray_cluster, tmp_path):
    study_dir = tmp_path / "studies"
    cmd = [sys.executable, "-m", "tuner", "--gpu", "h100", "--variant", "mha", "--trials", "40",
           "--study-dir", str(study_dir), "--ray-address", ray_cluster, "--backend", f"replay:{GRID}", "--seed", "5"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = study_dir / f"{STUDY}.journal"
    deadline = time.time() + 120
    completed = []
    try:
        while time.time() < deadline and proc.poll() is None:
            if journal.exists():
                try:
                    completed = [t for t in load(study_dir).trials if t.state == TrialState.COMPLETE]
                except Exception:  # the study may not be created yet
                    completed = []
                if len(completed) >= 4:
                    break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    killed = load(study_dir).trials
    done = {t.number: t.value for t in killed if t.state == TrialState.COMPLETE}
    stale = {t.number: t.params for t in killed if t.state == TrialState.RUNNING}
    assert len(done) >= 4 and stale, "the kill should leave trials in flight"
    finished_before = len([t for t in killed if t.state in (TrialState.COMPLETE, TrialState.PRUNED)])
    target = finished_before + len(stale) + 1
    assert run_campaign(options(study_dir, trials=target, resume=True, seed=5)) == 0
    after = load(study_dir).trials
    assert {t.number: t.value for t in after if t.number in done} == done            # nothing lost or redone
    for number, params in stale.items():
        assert after[number].state == TrialState.FAIL and after[number].user_attrs["stale"] is True
        redo = [t for t in after if t.user_attrs.get("redo_of") == number]
        if not params:   # killed between study.ask() and the first suggest: nothing to redo
            assert redo == []
            continue
        # killed mid-suggestion, a trial holds only its first parameters: the redo keeps those, samples the rest
        assert len(redo) == 1 and redo[0].params.items() >= params.items()
        assert redo[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert any(stale.values()), "the kill should leave trials with parameters in flight"


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("TUNER_TEST_POSTGRES_URL"), reason="TUNER_TEST_POSTGRES_URL not set")
def test_postgresql_storage(ray_cluster, tmp_path):
    url = os.environ["TUNER_TEST_POSTGRES_URL"]
    try:
        optuna.delete_study(study_name=STUDY, storage=url)
    except KeyError:
        pass
    assert run_campaign(options(tmp_path, storage=url, trials=6)) == 0
    assert run_campaign(options(tmp_path, storage=url, trials=6)) == 2            # exists: needs --resume
    assert run_campaign(options(tmp_path, storage=url, trials=9, resume=True)) == 0
    study = optuna.load_study(study_name=STUDY, storage=url)
    assert len([t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 9
    assert not (tmp_path / f"{STUDY}.journal").exists()


def test_dry_run_compiles_for_real_and_stores_nothing(tmp_path):
    """No GPU and no replay: nvcc builds each candidate (about 15-25 s each on 2 cores)."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    rc = run_campaign(options(tmp_path, backend=None, dry_run=True, trials=2, compile_batch=2))
    assert rc == 0
    study = load(tmp_path, STUDY + "-dryrun")
    done = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert len(done) == 2 and all(t.user_attrs["dry_run"] and t.constraints == {"infeasible": 0.0} for t in done)
    for t in done:
        assert t.user_attrs["registers"] > 0
        assert (tmp_path / (STUDY + "-dryrun") / "compiled" / (t.user_attrs["kernel_name"] + ".cubin")).stat().st_size > 0
    assert not (tmp_path / "kernels").exists()
