"""TPE (multivariate, group, infeasible-as-constraint) against random search on the recorded grid."""
from .search_efficiency import compare, grid_values, trials_to_target


def test_grid_target_is_rare_enough_to_measure_search():
    values = grid_values()
    best = max(values.values())
    assert sum(v >= 0.97 * best for v in values.values()) <= 5 < len(values) // 100


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
