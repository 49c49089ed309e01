"""Resume after a killed driver: trials it left RUNNING are failed and, where they had parameters, queued again."""
import optuna
from optuna.trial import TrialState

from tuner.campaign.study import fail_stale_running


def test_stale_trials_are_failed_and_only_those_with_parameters_are_queued_again():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    with_params = study.ask()
    with_params.suggest_int("block_n", 64, 128, step=64)
    with_params.suggest_int("stages", 1, 3)
    bare = study.ask()    # killed between ask() and its first suggest: no parameters recorded
    partial = study.ask()  # killed mid-suggestion: only its first parameter recorded
    partial.suggest_int("block_n", 64, 128, step=64)
    done = study.ask()
    done.suggest_int("block_n", 64, 128, step=64)
    study.tell(done, 1.0)

    assert fail_stale_running(study) == [with_params.number, bare.number, partial.number]

    trials = study.get_trials(deepcopy=False)
    for number in (with_params.number, bare.number, partial.number):
        assert trials[number].state == TrialState.FAIL and trials[number].user_attrs["stale"] is True
    assert trials[done.number].state == TrialState.COMPLETE
    redo = [t for t in trials if "redo_of" in t.user_attrs]
    assert [(t.user_attrs["redo_of"], t.state, t.system_attrs["fixed_params"]) for t in redo] == [
        (with_params.number, TrialState.WAITING, with_params.params),
        (partial.number, TrialState.WAITING, partial.params)]
    assert fail_stale_running(study) == []    # a second resume finds nothing left running

    for _ in redo:   # a redo fixes what its stale trial had suggested and samples the parameters it never reached
        trial = study.ask()
        trial.suggest_int("block_n", 64, 128, step=64)
        trial.suggest_int("stages", 1, 3)
        study.tell(trial, 2.0)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if "redo_of" in t.user_attrs:
            assert t.params.keys() == {"block_n", "stages"}
            assert t.params.items() >= trials[t.user_attrs["redo_of"]].params.items()
