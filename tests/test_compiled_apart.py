"""tuner/measure/compiled_apart.py: rounds alternate which model runs first and each side keeps its own round times (no
GPU: round timers stand in for the worker processes); slow: spawned workers on the CPU build the same weights,
compile, answer rounds and report a model that cannot be built."""
import pytest

from tuner.measure import compiled_apart


@pytest.fixture
def apart():
    return compiled_apart


def _timers(log, times):
    def make(name):
        def time_round(reps):
            log.append((name, reps))
            return times[name]
        return time_round
    return {name: make(name) for name in times}


def test_rounds_alternate_who_goes_first_and_ask_for_reps_forwards(apart):
    log = []
    ours, theirs = apart.paired_rounds(_timers(log, {"ours": 10.0, "eager": 12.0}), "ours", "eager", rounds=5, reps=3)
    assert log == [("ours", 3), ("eager", 3), ("eager", 3), ("ours", 3), ("ours", 3), ("eager", 3), ("eager", 3),
                   ("ours", 3), ("ours", 3), ("eager", 3)]
    assert ours == [10.0] * 5 and theirs == [12.0] * 5


def test_each_side_keeps_its_own_rounds_whichever_went_first(apart):
    import itertools

    ours_times, their_times = itertools.count(1.0), itertools.count(101.0)
    ours, theirs = apart.paired_rounds({"ours": lambda reps: next(ours_times), "flex": lambda reps: next(their_times)},
                                       "ours", "flex", rounds=7)
    assert ours == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] and theirs == [101.0 + i for i in range(7)]


def test_an_even_number_of_rounds_is_refused_before_any_forward(apart):
    log = []
    with pytest.raises(ValueError, match="odd"):
        apart.paired_rounds(_timers(log, {"ours": 1.0, "eager": 1.0}), "ours", "eager", rounds=4)
    assert log == []


@pytest.mark.slow
def test_worker_processes_build_the_same_weights_compile_and_answer_rounds_on_the_cpu():
    """Two spawned workers (transformers' eager and SDPA attention, a tiny Gemma-2) build the same weights from the
    seed (logits alike), compile, answer timed rounds through paired_rounds, and stop; a worker whose model cannot be
    built reports its error instead of hanging the pool."""
    pytest.importorskip("transformers")
    config = dict(vocab_size=64, hidden_size=64, intermediate_size=64, head_dim=16, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, sliding_window=8, attn_logit_softcapping=50.0,
                  final_logit_softcapping=30.0, query_pre_attn_scalar=16, max_position_embeddings=64)
    pool = compiled_apart.WorkerPool("gemma2", config, ["eager", "sdpa", "no-such-attention"], "sdpa", None,
                                     [(1, 16)], device="cpu")
    try:
        assert set(pool.ready) == {"eager", "sdpa"} and "no-such-attention" in pool.errors
        a, b = pool.logits("sdpa", 0), pool.logits("eager", 0)
        assert len(a) == 64 and max(abs(x - y) for x, y in zip(a, b)) < 0.1
        ours, theirs = compiled_apart.paired_rounds({"sdpa": pool.timer("sdpa", 0), "eager": pool.timer("eager", 0)},
                                                    "sdpa", "eager", rounds=3, reps=2)
        assert len(ours) == len(theirs) == 3 and all(t > 0 for t in ours + theirs)
    finally:
        pool.close()
    assert all(not p.is_alive() for p in pool.procs.values())
