"""The early stop (tuner/campaign/earlystop.py): its rule, and replays on the recorded grids showing that no
kernel the full measurement makes a bucket winner is ever stopped, and how much GPU time it saves."""
import json

import pytest

from tuner.campaign.earlystop import DEFAULT_EARLY_STOP, EarlyStop, TrialCost, decide
from kernel_abi.spec import grid_problems

from . import early_stop_sim as sim

PROBLEMS = grid_problems("mha", 128, "bf16", True)


def test_the_plan_probes_the_longest_seqlen_once_there_is_an_incumbent():
    rule = EarlyStop()
    assert rule.plan(PROBLEMS, None, sim.TIMING) is None          # nothing measured in full yet
    plan = rule.plan(PROBLEMS, 650.0, sim.TIMING)
    assert plan == {"seqlen": 16384, "incumbent": 650.0, "margin": 0.2,
                    "probe": {"warmup_ms": 5.0, "rep_ms": 20.0, "rotate": 3}}
    assert decide(plan, 521.0) is None                            # 0.80x and a bit: may still win somewhere
    stopped = decide(plan, 519.0)
    assert stopped == {"seqlen": 16384, "probe_tflops": 519.0, "incumbent": 650.0, "ratio": 0.7985, "margin": 0.2}
    with pytest.raises(ValueError, match="margin"):
        EarlyStop(margin=1.0)


def test_a_stopped_trial_costs_verification_and_one_short_probe():
    cost, n = TrialCost(), len(PROBLEMS)
    assert cost.full(n, sim.TIMING) == pytest.approx(0.27 + 6 * 0.22)         # 1.59 s: the H100's measured hold
    assert cost.probed(n, sim.TIMING, DEFAULT_EARLY_STOP, True) == pytest.approx(0.27 + 0.095 + 0.025)
    assert cost.probed(n, sim.TIMING, DEFAULT_EARLY_STOP, False) > cost.full(n, sim.TIMING)


@pytest.mark.parametrize("grid", [sim.FIXTURE, sim.MEASURED], ids=["recorded model grid", "measured Hopper grid"])
def test_no_bucket_winner_of_the_whole_grid_is_stopped(grid, capsys):
    """Every kernel of the grid once, seeds first, the rest in a seeded random order (a winner late in the
    order meets the strongest incumbent): the winner of each of the six buckets survives its probe.
    Measured: model grid 2062 of 2100 stopped, GPU 868 s instead of 3339 s (74% saved); measured grid 280 of
    380, 280 s instead of 604 s (54%)."""
    r = sim.grid_replay(0, grid)
    with capsys.disabled():
        print(f"\n{grid.name}: {r['stopped']} of {r['kernels']} stopped, GPU {r['gpu_s']} s instead of "
              f"{r['gpu_s_without']} s ({100 * r['saved']:.1f}% saved)")
    assert r["lost"] == [] and len(set(r["winners"].values())) >= 2
    assert r["stopped"] >= 0.7 * r["kernels"] and r["saved"] >= 0.5


def test_no_bucket_winner_is_stopped_with_a_noisy_probe(tmp_path):
    """The same on the recorded grid with every measurement (probes included) 3% noisy."""
    import gzip

    rows = [json.loads(line) for line in gzip.open(sim.FIXTURE, "rt")]
    rows[0]["_meta"]["noise"] = {"sigma": 0.03, "seed": 5}
    noisy = tmp_path / "noisy.jsonl.gz"
    with gzip.open(noisy, "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    r = sim.grid_replay(1, noisy)
    assert r["lost"] == [] and r["saved"] >= 0.5


@pytest.mark.slow   # a search replayed over the recorded grid
def test_a_search_on_the_recorded_grid_spends_far_less_gpu_time_and_loses_no_winner(capsys):
    """The campaign's sampler on the recorded grid (seeds enqueued, 150 distinct kernels): measured 127 of 150
    stopped, 87.9 s of GPU instead of 238.5 s (63.1% saved); no kernel that would win a bucket among those
    measured was stopped."""
    r = sim.search_replay(0, 150)
    with capsys.disabled():
        print(f"\nsearch on {sim.FIXTURE.name}: {r['stopped']} of {r['kernels']} stopped, GPU {r['gpu_s']} s "
              f"instead of {r['gpu_s_without']} s ({100 * r['saved']:.1f}% saved)")
    assert r["kernels"] == 150 and r["lost"] == []
    assert r["saved"] >= 0.5


@pytest.mark.slow   # a search replayed over the recorded grid
def test_the_early_stop_changes_nothing_the_sampler_proposes_on_the_measured_grid():
    """A stopped kernel is told pruned: TPE ranks it with the trials above its split, where it would be
    anyway (every one is 20% behind), so the sampler proposes the same kernels, reaches 3% of the grid's best
    after as many of them and spends less GPU time on the way (10 seeds: 33.8 kernels, 53.7 s -> 39.6 s)."""
    for seed in range(3):
        full, full_s = sim.kernels_to_target(seed, early_stop=False)
        early, early_s = sim.kernels_to_target(seed, early_stop=True)
        assert full is not None and early == full and early_s < full_s


def test_a_stopped_measurement_has_no_trial_value_and_the_cache_keeps_its_stop(tmp_path):
    """A probe is no value to rank trials by; the cache remembers the stop, so a re-proposal is told the same
    (the loop measures a seed in full even then)."""
    from tuner.campaign.cache import MeasurementCache, from_result
    from tuner.campaign.telling import measured_value

    stop = {"seqlen": 16384, "probe_tflops": 300.0, "incumbent": 650.0, "ratio": 0.4615, "margin": 0.2}
    stopped = {"verified": True, "tflops": {"16384": 300.0}, "early_stop": stop, "verification": {"passed": True}}
    full = {"verified": True, "tflops": {"512": 200.0, "16384": 800.0}, "verification": {"passed": True}}
    assert measured_value(stopped) is None and measured_value(full) == 400.0
    assert measured_value({"verified": False, "tflops": {}}) is None
    cache = MeasurementCache(tmp_path)
    cache.put(from_result("k", stopped, None, "study", 7, "kern", "study/compiled/kern"))
    hit = MeasurementCache(tmp_path).get("k")
    assert hit.verified and hit.value is None and hit.early_stop == stop and hit.tflops == {"16384": 300.0}


def test_the_cli_turns_the_early_stop_off(monkeypatch):
    from typer.testing import CliRunner

    import tuner.campaign
    from tuner.commands.cli import app

    seen = []
    monkeypatch.setattr(tuner.campaign, "run_campaign", lambda options: seen.append(options) or 0)
    for args, expected in ((["--gpu", "h100", "--variant", "mha"], True),
                           (["--gpu", "h100", "--variant", "mha", "--no-early-stop"], False)):
        assert CliRunner().invoke(app, args).exit_code == 0
        assert seen.pop().early_stop is expected
