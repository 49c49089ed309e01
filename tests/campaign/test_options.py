"""The campaign's numeric options: nonsense is refused with one message naming the option,
exit 2, before anything is created (no study dir, no journal, no Ray cluster)."""
import math

import pytest
from typer.testing import CliRunner

from tuner.campaign import CampaignOptions, run_campaign
from tuner.campaign.options import option_problems
from tuner.commands.cli import app


def options(**changes):
    return CampaignOptions(**{"gpu": "t4", "variant": "mha", "dry_run": True, **changes})


def test_the_defaults_and_sensible_values_are_accepted():
    assert option_problems(options()) == []
    assert option_problems(options(trials=1, timeout=0.5, trial_timeout=1, gpu_overlap=8, compile_batch=1,
                                   llm_sketches=0, seed=0, seqlens=(1, 16384), infra_retries=0,
                                   bench_warmup_ms=0)) == []
    assert option_problems(options(seed=2 ** 32 - 1, llm_sketches=8)) == []


@pytest.mark.parametrize("changes,message", [
    ({"timeout": -5.0}, "--timeout must be a positive number of seconds, got -5.0"),
    ({"timeout": 0}, "--timeout must be a positive number of seconds, got 0"),
    ({"timeout": math.nan}, "--timeout must be a positive number of seconds, got nan"),
    ({"timeout": math.inf}, "--timeout must be a positive number of seconds, got inf"),
    ({"trials": 0}, "--trials must be an integer of at least 1, got 0"),
    ({"trials": -3}, "--trials must be an integer of at least 1, got -3"),
    ({"trials": 2.5}, "--trials must be an integer of at least 1, got 2.5"),
    ({"trial_timeout": math.nan}, "--trial-timeout must be a positive number of seconds, got nan"),
    ({"trial_timeout": -1.0}, "--trial-timeout must be a positive number of seconds, got -1.0"),
    ({"gpu_overlap": 0}, "--gpu-overlap must be an integer from 1 to 8, got 0"),
    ({"gpu_overlap": True}, "--gpu-overlap must be an integer from 1 to 8, got True"),
    ({"compile_batch": 0}, "--compile-batch must be an integer of at least 1, got 0"),
    ({"llm_sketches": -1}, "--llm-sketches must be an integer from 0 to 8, got -1"),
    ({"seed": -1}, "--seed must be an integer from 0 to 4294967295, got -1"),
    ({"seed": 2 ** 32}, "--seed must be an integer from 0 to 4294967295, got 4294967296"),
    ({"seqlens": ()}, "--seqlens must be a list of positive integers, got ()"),
    ({"seqlens": (512, 0)}, "--seqlens must be a list of positive integers, got (512, 0)"),
    ({"compile_timeout": 0.0}, "compile_timeout must be a positive number of seconds, got 0.0"),
    ({"infra_retries": -1}, "infra_retries must be an integer of at least 0, got -1"),
    ({"bench_warmup_ms": -1.0}, "bench_warmup_ms must be a number of milliseconds of at least 0, got -1.0"),
    ({"bench_rep_ms": 0.0}, "bench_rep_ms must be a positive number of milliseconds, got 0.0"),
    ({"bench_rotate": 0}, "bench_rotate must be an integer of at least 1, got 0"),
])
def test_each_nonsensical_number_is_named(changes, message):
    assert option_problems(options(**changes)) == [message]


def test_run_campaign_refuses_them_before_creating_anything(tmp_path, capsys):
    study_dir = tmp_path / "studies"
    assert run_campaign(options(study_dir=study_dir, timeout=-5.0, seed=-1)) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tune: error: --timeout must be a positive number of seconds, got -5.0; --seed must be an integer from 0 "
        "to 4294967295, got -1"]
    assert not study_dir.exists()


@pytest.mark.parametrize("args,message", [
    (["--timeout", "-5"], "tune: error: --timeout must be a positive number of seconds, got -5.0"),
    (["--timeout", "0"], "tune: error: --timeout must be a positive number of seconds, got 0.0"),
    (["--timeout", "nan"], "tune: error: --timeout must be a positive number of seconds, got nan"),
    (["--trial-timeout", "nan"], "tune: error: --trial-timeout must be a positive number of seconds, got nan"),
    (["--seed", "-1"], "tune: error: --seed must be an integer from 0 to 4294967295, got -1"),
    (["--trials", "-3"], "--trials"),          # typer's own range check
    (["--compile-batch", "0"], "--compile-batch"),
])
def test_the_cli_exits_2_with_one_message_and_no_study(tmp_path, args, message):
    study_dir = tmp_path / "studies"
    result = CliRunner().invoke(app, ["--gpu", "t4", "--variant", "mha", "--dry-run", "--study-dir", str(study_dir),
                                      *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert not study_dir.exists() and list(tmp_path.iterdir()) == []


def test_a_sampler_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    """Optuna imports CMA-ES's and the GP sampler's packages on the first ask: a campaign without them would
    fail every trial. Refused up front, with the install line."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a))
    assert option_problems(options(sampler="cmaes")) == [
        "--sampler cmaes needs the cmaes package(s): pip install cmaes"]
    assert option_problems(options(sampler="tpe")) == []
