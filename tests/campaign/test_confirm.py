"""The confirmed-winner rule (tuner/campaign/confirm.py) and each bucket's decision (winners.decide)."""
import random
import statistics

import pytest

from tuner.campaign.confirm import ConfirmRule, median_interval, round_ratios, verdict, verdict_across
from tuner.campaign.winners import Contender, Contest, decide
from kernel_abi.spec import Problem

RULE = ConfirmRule()


@pytest.mark.parametrize("values", [
    [1.02, 0.99, 1.05, 1.01, 0.97, 1.03, 1.00, 1.04, 0.98],
    [1.0, 1.0, 1.0, 1.01, 1.01, 0.99, 1.02, 1.0, 0.98],            # ties
    [0.95, 1.10, 1.02],
])
def test_the_exact_interval_is_the_percentile_bootstraps_limit(values):
    """The bounds computed from the binomial law of the resampled median are what 200k resamples give."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(200_000))
    low, high = median_interval(values, 0.95)
    assert low == meds[int(0.025 * len(meds))] and high == meds[int(0.975 * len(meds)) - 1]


def test_with_nine_rounds_a_challenger_must_win_eight_of_them():
    """At 95% the lower bound of 9 rounds is the second smallest ratio: a tie passes with probability
    10/512 (2%), where 7 rounds (the second smallest of 7) let one in 16 through."""
    faster_8 = [1.03] * 8 + [0.97]
    faster_7 = [1.03] * 7 + [0.97, 0.98]
    ones = [1.0] * 9
    assert verdict(ones, faster_8).confirmed       # per round: the incumbent's time over the challenger's
    assert not verdict(ones, faster_7).confirmed
    v = verdict(ones, faster_8)
    assert v.low == pytest.approx(1.03) and v.ratio == pytest.approx(1.03) and v.rounds == 9
    assert median_interval(faster_7, 0.95)[0] == pytest.approx(0.98)
    assert v.text() == "×1.030 [1.030, 1.030]"


def test_a_slower_challenger_has_its_interval_below_one():
    v = verdict([1.05, 1.04, 1.06, 1.05, 1.05, 1.07, 1.04, 1.05, 1.06], [1.0] * 9)
    assert not v.confirmed and v.high < 1 and v.ratio == pytest.approx(1 / 1.05)


@pytest.mark.parametrize("kw,message", [({"rounds": 8}, "odd integer"), ({"rounds": 1}, "odd integer"),
                                        ({"confidence": 1.0}, "confidence"), ({"rep_ms": 0}, "rep_ms")])
def test_the_rule_refuses_settings_it_cannot_use(kw, message):
    with pytest.raises(ValueError, match=message):
        ConfirmRule(**kw)


def test_round_ratios_need_one_positive_time_per_round():
    assert round_ratios([1.0, 2.0], [2.0, 2.0]) == [2.0, 1.0]
    with pytest.raises(ValueError, match="one time per round"):
        round_ratios([1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="positive and finite"):
        round_ratios([0.0], [1.0])


# ---- decisions ------------------------------------------------------------------------------------------------

PROBLEM = Problem("mha", 1, 16, 16, 4096, 4096, 128, 128, True, "bf16")


def _c(role, sha, tflops=500.0, seeded=False, trial=None):
    return Contender(role, f"k_{sha}", sha, {"4096": tflops}, {}, "ws_overlap", "seed" if seeded else "search",
                     trial, seeded)


CHALLENGER, SEED, STORED = _c("challenger", "c", 520.0, trial=40), _c("seed", "s", 500.0, True, 1), _c("stored", "k")


def _retimed(**ms):
    """A re-timing's result: per role, 9 rounds of milliseconds."""
    return {"ms": {role: [t] * 9 for role, t in ms.items()}, "failed": {}, "order": [list(ms)] * 9}


def test_a_challenger_clearly_faster_than_the_best_seed_wins_and_is_stored():
    d = decide(Contest("s4096", PROBLEM, CHALLENGER, SEED, None), _retimed(challenger=1.0, seed=1.05))
    assert d.winner is CHALLENGER and d.store and d.search_beat_seeds
    assert d.vs_seed.confirmed and d.vs_seed.ratio == pytest.approx(1.05) and d.vs_stored is None
    assert d.to_dict()["search_beat_seeds"] is True and d.to_dict()["winner"] == "challenger"


def test_a_challenger_within_the_noise_leaves_the_best_seed_the_winner():
    noisy = {"challenger": [1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.03, 0.97], "seed": [1.0] * 9}
    d = decide(Contest("s4096", PROBLEM, CHALLENGER, SEED, None), {"ms": noisy, "failed": {}})
    assert d.winner is SEED and d.store and not d.search_beat_seeds
    assert not d.vs_seed.confirmed and d.vs_seed.low < 1 < d.vs_seed.high
    assert "not clearly faster, the seed stands" in d.note


def test_the_store_keeps_its_kernel_unless_the_runs_winner_is_clearly_faster():
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, STORED)
    kept = decide(contest, _retimed(challenger=1.0, seed=1.05, stored=1.0))
    assert kept.winner is CHALLENGER and kept.search_beat_seeds and not kept.store
    assert not kept.vs_stored.confirmed and "the stored kernel stays" in kept.note
    replaced = decide(contest, _retimed(challenger=1.0, seed=1.05, stored=1.04))
    assert replaced.store and replaced.vs_stored.confirmed and "replaces it" in replaced.note
    # the seed is the run's winner: it is the one compared with the stored kernel
    seed_wins = decide(contest, _retimed(challenger=1.0, seed=1.0, stored=1.10))
    assert seed_wins.winner is SEED and seed_wins.store and seed_wins.vs_stored.ratio == pytest.approx(1.10)


def test_without_a_re_timing_nothing_is_claimed_and_the_stored_kernel_stays():
    failed = decide(Contest("s4096", PROBLEM, CHALLENGER, SEED, STORED), None, "crash: the process died of SIGSEGV")
    assert failed.winner is SEED and not failed.store and not failed.search_beat_seeds
    assert "not re-timed (crash: the process died of SIGSEGV)" in failed.note
    first = decide(Contest("s4096", PROBLEM, CHALLENGER, SEED, None), None, "no answer in time")
    assert first.winner is SEED and first.store       # nothing stored: the best seed is


def test_a_seed_challenger_needs_no_re_timing_and_the_same_kernel_is_not_stored_twice():
    seed_best = _c("challenger", "s", 510.0, True, 1)
    contest = Contest("s4096", PROBLEM, seed_best, None, None)
    assert not contest.needs_retiming()
    d = decide(contest, None)
    assert d.winner is seed_best and d.store and d.note == "the challenger is the best seed; the store held nothing for the bucket: stored"
    again = Contest("s4096", PROBLEM, seed_best, None, _c("stored", "s"))
    assert not again.needs_retiming() and not decide(again, None).store


def test_the_stored_kernel_may_be_this_runs_seed_and_is_timed_once():
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, _c("stored", "s"))
    assert [c.role for c in contest.timed()] == ["challenger", "seed"]
    d = decide(contest, _retimed(challenger=1.0, seed=1.06))
    assert d.winner is CHALLENGER and d.store and d.vs_stored.ratio == pytest.approx(1.06)


def test_a_contender_that_cannot_be_timed_again_cannot_win():
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, STORED)
    stale = {"ms": {"challenger": [1.0] * 9, "seed": [1.0] * 9}, "failed": {"stored": "load failed: ABI 1"}}
    d = decide(contest, stale)
    assert d.winner is SEED and d.store and "the stored kernel could not be timed here" in d.note
    broken = {"ms": {"seed": [1.0] * 9, "stored": [1.0] * 9}, "failed": {"challenger": "wrong result"}}
    d = decide(contest, broken)
    assert d.winner is SEED and not d.search_beat_seeds and "the challenger could not be timed again" in d.note


def test_a_win_must_hold_in_every_fresh_process():
    faster, tied = ([1.0] * 9, [1.02] * 9), ([1.0, 1.01, 0.99] * 3, [1.0] * 9)
    assert verdict_across([faster, faster]).confirmed
    both = verdict_across([faster, tied])
    assert not both.confirmed and both.rounds == 18
    assert both.low == verdict(*tied).low and both.high == verdict(*faster).high   # the processes' span
    assert verdict_across([faster]) == verdict(*faster)
    with pytest.raises(ValueError, match="processes"):
        ConfirmRule(processes=0)


def test_the_seed_stands_when_a_second_process_does_not_confirm_the_challenger():
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, None)
    first, second = _retimed(challenger=1.0, seed=1.02), _retimed(challenger=1.0, seed=1.0)
    first["pid"], second["pid"] = 11, 12
    d = decide(contest, [first, second])
    assert d.winner is SEED and not d.search_beat_seeds and not d.vs_seed.confirmed
    assert "2 fresh processes" in d.note and d.to_dict()["retimed"]["pids"] == [11, 12]
    assert decide(contest, [first, dict(first)]).search_beat_seeds


# ---- the per-spec default (the bucket-defaults table's evidence) ---------------------------------------------

DEFAULT = _c("default", "d", 480.0, True, 0)


def test_the_winner_is_judged_against_the_per_spec_default_in_every_process_and_that_decides_nothing_else():
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, None, DEFAULT)
    assert [c.role for c in contest.timed()] == ["challenger", "seed", "default"]
    runs = [_retimed(challenger=1.0, seed=1.05, default=1.03), _retimed(challenger=1.0, seed=1.05, default=1.02)]
    d = decide(contest, runs)
    assert d.winner is CHALLENGER and d.store and d.vs_default.confirmed
    assert d.vs_default.ratio == pytest.approx(1.025) and "the per-spec default (2 fresh processes)" in d.note
    record = d.to_dict()
    assert record["default"]["sha256"] == "d" and record["vs_default"]["confirmed"] is True
    assert [p["default"] for p in record["ms_per_process"]] == [[1.03] * 9, [1.02] * 9]
    # a second process that does not confirm it: not confirmed (the rule holds in each process)
    split = decide(contest, [_retimed(challenger=1.0, seed=1.05, default=1.03), _retimed(challenger=1.0, seed=1.05, default=1.0)])
    assert split.winner is CHALLENGER and not split.vs_default.confirmed


def test_the_default_that_is_the_best_seed_is_timed_once_and_the_default_winning_gives_no_verdict():
    as_seed = _c("default", "s", 500.0, True, 1)
    contest = Contest("s4096", PROBLEM, CHALLENGER, SEED, None, as_seed)
    assert [c.role for c in contest.timed()] == ["challenger", "seed"]
    d = decide(contest, _retimed(challenger=1.0, seed=1.05))
    assert d.vs_default.ratio == pytest.approx(1.05) and d.to_dict()["ms_per_process"][0]["default"] == [1.05] * 9
    lost = decide(contest, _retimed(challenger=1.0, seed=0.99))
    assert lost.winner is SEED and lost.vs_default is None       # the default itself won: nothing to change
    # a challenger that is the best seed, with the default another seed: re-timed for the default alone
    seed_best = _c("challenger", "s", 510.0, True, 1)
    alone = Contest("s4096", PROBLEM, seed_best, None, None, DEFAULT)
    assert alone.needs_retiming()
    assert decide(alone, _retimed(challenger=1.0, default=1.04)).vs_default.confirmed
