"""The confirmed-winner rule against the maximum of single measurements on a noisy grid (winners_sim.py): 20
simulated campaigns x 6 buckets per noise level, every number seeded, so the counts are exact."""
import pytest

from .winners_sim import compare, noisy_grid

# a replay of 120 buckets per noise level: seconds each (python -m tests.campaign.winners_sim)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noisy")
    return {sigma: compare(noisy_grid(tmp, sigma), campaigns=20) for sigma in (0.03, 0.06)}


@pytest.mark.parametrize("sigma,single_at_least", [(0.03, 40), (0.06, 70)])
def test_the_rule_stores_far_fewer_false_winners_than_the_max_of_single_measurements(results, sigma,
                                                                                      single_at_least):
    """A false winner: a kernel found by the search, stored as beating the seeds, truly no faster than the best
    seed. Measured: 52 (3% noise) and 83 (6%) of 120 buckets with the maximum of single measurements, 1 and 1
    with the rule (BENCHMARKS.md)."""
    single, rule = results[sigma]["max_single"], results[sigma]["rule"]
    assert single["buckets"] == rule["buckets"] == 120
    assert single["false_winners"] >= single_at_least, single
    assert rule["false_winners"] <= 2, rule
    # the winner's curse: the single measurements claim a gain that the kernels do not have
    assert single["mean_claimed_gain_of_claims"] > 1.04 and single["mean_true_gain_of_claims"] < 1.0
    # what the rule stores is, on average, truly faster than the best seed; the maximum's is slower
    assert rule["mean_true_gain_of_claims"] > 1.0 and rule["mean_true_gain"] > single["mean_true_gain"]


def test_the_rule_still_confirms_real_wins_at_3_percent_noise(results):
    """Some kernels of the grid are truly 1-4% faster than the best seed at a bucket: the rule finds some."""
    rule = results[0.03]["rule"]
    assert rule["true_wins"] >= 5 and rule["true_wins"] > 4 * rule["false_winners"], rule
