"""TPE (multivariate, group, infeasible-as-constraint) against random search on the recorded grid."""

import pytest

from .search_efficiency import compare, grid_values, trials_to_target


def test_grid_target_is_rare_enough_to_measure_search():
    values = grid_values()
    best = max(values.values())
    assert sum(v >= 0.97 * best for v in values.values()) <= 5 < len(values) // 100


@pytest.mark.slow
def test_tpe_reaches_3_percent_of_the_grid_best_in_fewer_trials_than_random():
    # 8 seeds, 200 trials: TPE misses 2 (random 6) on this grid, where ~60% of the asks are invalid
    result = compare(("tpe", "random"), seeds=range(8), budget=200)
    tpe, rnd = result["tpe"], result["random"]
    assert tpe["missed"] <= 3, tpe
    assert tpe["mean"] < 0.75 * rnd["mean"], result


def test_a_run_stops_counting_at_the_target():
    values = grid_values()
    n = trials_to_target("tpe", 2, values, budget=150)
    assert n is not None and n < 150


@pytest.mark.slow
def test_on_the_measured_hopper_grid_tpe_needs_under_15_percent_and_half_of_randoms_trials():
    """The search's bar on a grid measured point by point on the H100 (380 warp-specialised kernels, 2 within 3%
    of the best): distinct kernels measured until one is within 3%, 10 sampler seeds each, each sampler as the
    campaign runs it (the nearest unasked point after a repeat)."""
    from .search_efficiency import compare_measured, measured_grid

    fs, values = measured_grid()
    assert len(values) == len(fs.points) == 380            # exhaustive: every valid point of the space measured
    result = compare_measured(("tpe", "random"), seeds=range(10), budget=len(values), near=True)
    tpe, rnd = result["tpe"], result["random"]
    assert tpe["missed"] == 0 and tpe["mean"] <= 0.15 * len(values), result
    assert tpe["mean"] * 2 <= rnd["mean"], result


def test_the_published_seeds_are_points_of_the_measured_grid():
    from .search_efficiency import (
        measured_grid,
        measured_trials_to_target,
        published_seeds,
    )

    grid = measured_grid()
    assert len(published_seeds(grid[0])) >= 2
    assert measured_trials_to_target("tpe", 0, 380, enqueue_seeds=True, grid=grid) is not None


@pytest.mark.slow
def test_the_campaigns_search_needs_fewer_kernels_and_asks_than_optunas_tpe_alone():
    """The loop's answer to a re-proposal (the nearest valid point not asked yet, enqueued) with TPE reading
    the study without its repeats, against Optuna's TPE alone (repeats told and seen, nothing enqueued): on
    the measured grid it must not cost kernels measured and must cut the asks that bring nothing new
    (measured over 10 seeds: 26.5 kernels and 34.7 asks against 35.9 and 74.5)."""
    from .search_efficiency import compare_measured, measured_grid

    budget = len(measured_grid()[1])
    plain = compare_measured(("tpe",), seeds=range(10), budget=budget, distinct=False)["tpe"]
    near = compare_measured(("tpe",), seeds=range(10), budget=budget, near=True)["tpe"]
    assert near["missed"] == 0 and near["mean"] <= 0.15 * budget, near
    assert near["mean"] <= plain["mean"], (near, plain)
    assert near["mean_asks"] < 0.6 * plain["mean_asks"], (near, plain)
