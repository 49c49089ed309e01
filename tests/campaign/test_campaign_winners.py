"""Confirmed winners in a whole campaign (fake-GPU Ray cluster, replay backend): the GPU workers re-time each
bucket's challenger against the best seed and the stored kernel before anything is stored or claimed, and the
early stop drops only kernels far behind."""
import gzip
import json

import pytest
from optuna.trial import TrialState

from tuner.campaign import run_campaign
from tuner.campaign.study import is_seed
from tuner.store.records import KernelStore

from .conftest import GRID, STUDY, campaign_seed_keys, load_study, replay_options

pytestmark = pytest.mark.slow


def _grid(path, lucky: bool):
    """The recorded grid with every kernel that is not a seed measured 2x faster in its trials; ``lucky``: its
    re-timing finds it at half its recorded speed (the trials' numbers were luck), else at the trials' speed."""
    from translate.params import KernelParams

    seeds = set(campaign_seed_keys()[0])
    rows = []
    for r in (json.loads(line) for line in gzip.open(GRID, "rt")):
        if "params" in r and KernelParams.from_dict(r["params"]).key() not in seeds:
            truth = r["tflops"]
            r = dict(r, tflops={s: 2 * v for s, v in truth.items()})
            if lucky:
                r["retimed"] = {s: 0.5 * v for s, v in truth.items()}
        rows.append(r)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def lucky_run(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("winners")
    rc = run_campaign(replay_options(root / "studies", backend=f"replay:{_grid(root / 'lucky.jsonl', True)}",
                                     trials=20))
    summary = json.loads((root / "studies" / STUDY / "summary.json").read_text())
    return {"rc": rc, "root": root, "summary": summary}


def test_lucky_single_measurements_are_re_timed_and_the_seeds_stay_the_winners(lucky_run):
    assert lucky_run["rc"] == 0
    study_dir = lucky_run["root"] / "studies"
    study = load_study(study_dir)
    summary = lucky_run["summary"]
    contested = [w for w in summary["winners"] if w["seed"] is not None]
    assert contested, "no bucket's best single measurement was a kernel of the search"
    for w in contested:
        c, seed = w["challenger"], w["seed"]
        assert c["tflops"] > seed["tflops"]                            # the trials said the search won...
        assert not w["vs_seed"]["confirmed"] and w["vs_seed"]["high"] < 1    # ... re-timed, it is slower
        assert w["winner"] == "seed" and not w["search_beat_seeds"] and w["store"]
        assert w["retimed"]["rounds"] == summary["confirm_rule"]["rounds"] == 9
        assert w["retimed"]["pid"] not in {t.user_attrs.get("pid") for t in study.trials}   # a fresh process
    assert not any(r["search_beat_seeds"] for r in summary["search_vs_seeds"])
    seeds = {t.number for t in study.trials if is_seed(t)}
    records = KernelStore(study_dir).records(gpu="h100", variant="mha")
    assert len(records) == 6 and all(r.trial in seeds for r in records)
    for r in records:
        (w,) = [w for w in summary["winners"] if w["bucket"] == r.bucket]
        assert r.confirmation["note"] == w["note"] and r.confirmation["rule"]["rounds"] == 9
    report = (study_dir / STUDY / "report.md").read_text()
    assert "## Bucket winners, re-timed" in report and "re-timed ×seed [interval]" in report
    w = contested[0]
    assert f"×{w['vs_seed']['ratio']:.3f} [{w['vs_seed']['low']:.3f}, {w['vs_seed']['high']:.3f}]" in report


def test_early_stopped_trials_are_pruned_feasible_never_seeds_and_never_stored(lucky_run):
    study = load_study(lucky_run["root"] / "studies")
    stopped = [t for t in study.trials if t.user_attrs.get("early_stop")]
    assert stopped, "the search's slow proposals (the Hopper sketches, valued by the performance model) should stop"
    for t in stopped:
        assert t.state == TrialState.PRUNED and t.user_attrs["constraint"] == [0.0] and not is_seed(t)
        stop = t.user_attrs["early_stop"]
        assert stop["ratio"] < 0.8 and set(t.user_attrs["tflops"]) == {str(stop["seqlen"])}
        assert t.intermediate_values == {0: stop["probe_tflops"]}
    assert all(len(t.user_attrs["tflops"]) == 6 for t in study.trials
               if t.state == TrialState.COMPLETE)                       # the seeds and the rest: in full
    early = lucky_run["summary"]["early_stop"]
    assert early["enabled"] and early["stopped"] == len([t for t in stopped if not t.user_attrs.get("cache_hit")])
    assert early["rule"]["margin"] == 0.2


@pytest.fixture(scope="module")
def honest_run(lucky_run):
    """The lucky run's study resumed on a grid where the search's kernels are truly 2x (no luck), once for the
    module: what the tests below read, whichever of them runs first (or alone)."""
    root = lucky_run["root"]
    before = {r.bucket: r for r in KernelStore(root / "studies").records(gpu="h100", variant="mha")}
    rc = run_campaign(replay_options(root / "studies", backend=f"replay:{_grid(root / 'honest.jsonl', False)}",
                                     trials=22, resume=True))
    summary = json.loads((root / "studies" / STUDY / "summary.json").read_text())
    return {"rc": rc, "root": root, "before": before, "summary": summary}


def test_a_resumed_run_whose_challengers_are_truly_faster_replaces_the_stored_seeds(honest_run):
    """Re-timed on the honest grid, each challenger beats the best seed and the stored kernel (that seed, stored
    by the first run) and replaces it."""
    root, before, summary = honest_run["root"], honest_run["before"], honest_run["summary"]
    assert honest_run["rc"] == 0
    after = {r.bucket: r for r in KernelStore(root / "studies").records(gpu="h100", variant="mha")}
    contested = [w for w in summary["winners"] if w["seed"] is not None]
    assert contested
    for w in contested:
        assert w["vs_seed"]["confirmed"] and w["vs_seed"]["low"] > 1 and w["search_beat_seeds"]
        assert w["stored"]["sha256"] == before[w["bucket"]].kernel_sha256
        assert w["vs_stored"]["confirmed"] and w["store"]
        record = after[w["bucket"]]
        assert record.trial == w["challenger"]["trial"] and record.kernel_sha256 != before[w["bucket"]].kernel_sha256
        assert record.confirmation["vs_seed"]["confirmed"] and record.confirmation["search_beat_seeds"]
    assert any(r["search_beat_seeds"] for r in summary["search_vs_seeds"])


def test_the_separate_check_re_times_every_claim_and_says_whether_it_holds(honest_run, tmp_path):
    """scripts/retime_check.py, the device run's independent check: each "search beat the seeds" of the
    resumed run re-timed in a fresh process of its own (15 rounds). On the grid the campaign ran, every claim
    holds; on a grid where those kernels are slow when timed again, none does (exit 1)."""
    import os
    import subprocess
    import sys

    from .conftest import REPO

    root, summary = honest_run["root"], honest_run["summary"]
    claimed = {w["bucket"] for w in summary["winners"] if w["search_beat_seeds"]}
    assert claimed
    for grid, code in (("honest.jsonl", 0), ("lucky.jsonl", 1)):
        out = tmp_path / f"{grid}.json"
        proc = subprocess.run([sys.executable, "scripts/retime_check.py", str(root / "studies"), str(out),
                               "--backend", f"replay:{root / grid}"], cwd=REPO, capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))   # this checkout's package
        assert proc.returncode == code, proc.stdout + proc.stderr
        result = json.loads(out.read_text())
        assert {c["bucket"] for c in result["claims"]} == claimed and result["rounds"] == 15
        assert all(c["holds"] is (code == 0) and c["recheck"]["rounds"] == 15 for c in result["claims"])
        assert proc.stdout.count("HOLDS" if code == 0 else "DOES NOT HOLD") == len(claimed)


def test_each_winner_is_re_timed_against_the_per_spec_default_and_tune_defaults_reads_the_study_dir(honest_run, tmp_path):
    """The per-spec default is a seed of the dense campaign and every bucket's winner that is not it is re-timed
    against it in each fresh process; `tune defaults` derives the GPU's table from the study dir (here the winners
    are sm80-schedule kernels, which a table of KernelParams changes to the warp-specialised default cannot hold:
    left out, each with its reason)."""
    from typer.testing import CliRunner

    from tuner.commands.cli import app

    summary = honest_run["summary"]
    assert summary["spec"] == {"variant": "mha", "d_qk": 128, "d_v": 128, "causal": True, "dtype": "bf16",
                               "layout": "dense", "phase": "prefill"}
    study = load_study(honest_run["root"] / "studies")
    (default_trial,) = [t for t in study.trials if str(t.user_attrs.get("source", "")).startswith("the per-spec default")]
    rounds, processes = summary["confirm_rule"]["rounds"], summary["confirm_rule"]["processes"]
    judged = [w for w in summary["winners"] if w["default"]["sha256"] != w[w["winner"]]["sha256"]]
    assert judged
    for w in summary["winners"]:
        assert w["default"]["trial"] == default_trial.number
    for w in judged:
        assert w["vs_default"] is not None and len(w["ms_per_process"]) == processes
        assert all(len(p["default"]) == len(p[w["winner"]]) == rounds for p in w["ms_per_process"])
    out = tmp_path / "h100.toml"
    result = CliRunner().invoke(app, ["defaults", "--gpu", "h100", "--study-dir", str(honest_run["root"] / "studies"),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    confirmed = [w for w in judged if w["vs_default"]["confirmed"]]
    assert confirmed
    for w in confirmed:
        assert f"{w['bucket']}: the winner's schedule" in " ".join(result.output.split())
    assert "No change was confirmed" in out.read_text()
    assert [p.name for p in (tmp_path / "records" / "h100").iterdir()] == [f"campaign-{STUDY}.json"]
