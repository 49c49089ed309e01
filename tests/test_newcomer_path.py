"""A newcomer's first hour on a CPU machine (fresh clone, no GPU): every bad path and flag is one line on stderr,
``tune: error: ...`` (or ``tune build: error: ...``), never a traceback, and nothing is left behind; a dry run has
a small default budget and says how long it takes; the live line and the last lines count failures alike; a dry
run and a campaign end with a ``next:`` line; ``--help`` shows no type after a flag.

The bad inputs are refused before Ray or nvcc start (each test well under 2 s); the one real dry run is slow."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tuner.commands.cli import app

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, code: int = 2, command: str = "tune") -> str:
    """Exit ``code``; stderr is one line ``<command>: error: ...``; no traceback anywhere."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    return lines[0]


def campaign(tmp_path, *args: str, study_dir=None):
    """A dry-run campaign of ``args`` (the bad one among them) in a study dir under ``tmp_path``."""
    study_dir = tmp_path / "studies" if study_dir is None else study_dir
    return run("--gpu", "t4", "--variant", "mha", "--dry-run", "--study-dir", str(study_dir), *args)


# -- the campaign's flags: refused before anything is created ----------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["--gpu", "x100"], "unknown GPU 'x100'"),
    (["--variant", "mxa"], "unknown variant 'mxa'"),
    (["--head-dim", "80"], "80"),
    (["--head-dim", "abc"], "abc"),
    (["--dtype", "fp8"], "fp8"),
    (["--trials", "0"], "--trials"),
    (["--trials", "-1"], "--trials"),
    (["--trials", "abc"], "--trials"),
    (["--timeout", "-5"], "--timeout must be a positive number of seconds, got -5.0"),
    (["--timeout", "soon"], "--timeout"),
    (["--layout", "bogus"], "--layout must be one of"),
    (["--gpu", "h100", "--layout", "paged", "--page-size", "7"], "--page-size must be one of 16, 32, 64, 128, 256"),
    (["--layout", "paged"], "--layout paged needs a Hopper GPU"),
    (["--page-size", "16"], "--page-size applies to --layout paged only"),
    (["--llm-sketches", "-1"], "--llm-sketches"),
    (["--llm-sketches", "9"], "--llm-sketches"),
    (["--backend", "replay:/nonexistent/grid.jsonl"], "replay file '/nonexistent/grid.jsonl' does not exist"),
    (["--backend", "tpu"], "unknown backend 'tpu'"),
    (["--sampler", "annealing"], "unknown sampler 'annealing'"),
    (["--seqlens", "512,abc"], "--seqlens"),
    (["--seqlens", "0"], "--seqlens"),
    (["--phase", "training"], "--phase must be prefill, decode or all"),
    (["--seed", "-1"], "--seed"),
    (["--gpu-overlap", "0"], "--gpu-overlap"),
    (["--bogus"], "No such option: --bogus"),
])
def test_a_bad_campaign_flag_is_one_line_and_creates_nothing(tmp_path, args, words):
    line = assert_one_line_error(campaign(tmp_path, *args))
    assert words in line
    assert list(tmp_path.iterdir()) == []


def test_a_campaign_without_its_target_says_what_it_needs_in_one_line(tmp_path):
    line = assert_one_line_error(run("--gpu", "t4", "--study-dir", str(tmp_path / "s")))
    assert "needs --gpu and --variant or --model" in line and "--dry-run" in line
    bare = run()   # nothing asked: the help on stdout, then the same one line on stderr
    assert bare.exit_code == 2 and "Usage: tune" in bare.stdout and len(bare.stderr.splitlines()) == 1


# -- the study dir ------------------------------------------------------------------------------------------------

def test_a_study_dir_that_is_a_file(tmp_path):
    path = tmp_path / "studies"
    path.write_text("not a directory\n")
    line = assert_one_line_error(campaign(tmp_path, study_dir=path))
    assert line == f"tune: error: --study-dir {path} is not a directory (a file)"


def test_a_study_dir_under_a_file(tmp_path):
    parent = tmp_path / "notes.txt"
    parent.write_text("x\n")
    line = assert_one_line_error(campaign(tmp_path, study_dir=parent / "studies"))
    assert line == f"tune: error: --study-dir {parent / 'studies'} cannot be created: {parent} is not a directory"


def _read_only(path: Path, monkeypatch) -> None:
    """``path`` not writable for this process: its mode, and (root writes anywhere) os.access saying so."""
    path.chmod(0o555)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == path and mode & os.W_OK
                            else real(p, mode, *a, **k))


def test_an_empty_read_only_study_dir(tmp_path, monkeypatch):
    path = tmp_path / "ro"
    path.mkdir()
    _read_only(path, monkeypatch)
    try:
        line = assert_one_line_error(campaign(tmp_path, study_dir=path))
        assert line == f"tune: error: --study-dir {path} is not writable (permission denied)"
        assert list(path.iterdir()) == []
    finally:
        path.chmod(0o755)


def test_a_study_dir_under_a_read_only_parent(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    _read_only(parent, monkeypatch)
    try:
        line = assert_one_line_error(campaign(tmp_path, study_dir=parent / "studies"))
        assert line == (f"tune: error: --study-dir {parent / 'studies'} cannot be created: {parent} is not writable "
                        "(permission denied)")
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def test_the_study_dir_check_names_a_read_only_file_system(tmp_path, monkeypatch):
    from tuner.campaign import options

    monkeypatch.setattr(options.os, "access", lambda p, mode: not mode & os.W_OK)
    monkeypatch.setattr(options.os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY))
    assert options.study_dir_problem(tmp_path) == f"--study-dir {tmp_path} is not writable (a read-only file system)"
    assert options.study_dir_problem(tmp_path / "a" / "b") == (
        f"--study-dir {tmp_path / 'a' / 'b'} cannot be created: {tmp_path} is not writable (a read-only file system)")


def test_resume_of_a_missing_study_leaves_nothing_behind(tmp_path):
    empty = tmp_path / "studies"
    empty.mkdir()
    line = assert_one_line_error(campaign(tmp_path, "--resume", study_dir=empty))
    assert "--resume: no study 't4-mha-fp16-d128-causal-dryrun'" in line and "run without --resume" in line
    assert list(empty.iterdir()) == []      # no journal, no lock file, no study folder
    missing = tmp_path / "nowhere"
    line = assert_one_line_error(campaign(tmp_path, "--resume", study_dir=missing))
    assert line == (f"tune: error: --resume: the study dir {missing} does not exist; run without --resume to start "
                    "the campaign there")
    assert not missing.exists()


def test_resume_points_at_the_dry_run_twin(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "t4-mha-fp16-d128-causal-dryrun.journal").write_text("")
    line = assert_one_line_error(run("--gpu", "t4", "--variant", "mha", "--resume", "--study-dir", str(studies)))
    assert "holds 't4-mha-fp16-d128-causal-dryrun': resume it with --dry-run" in line
    assert sorted(p.name for p in studies.iterdir()) == ["t4-mha-fp16-d128-causal-dryrun.journal"]


# -- sketches: `tune check` and `tune build` answer the same file with the same code ----------------------------

def test_a_non_utf8_sketch_names_the_file_and_exits_2_in_both(tmp_path):
    sketch = tmp_path / "sketch.tl"
    sketch.write_bytes("Copy Q from global to shared // 注意\n".encode("gbk"))
    line = assert_one_line_error(run("build", "--gpu", "t4", "--variant", "mha", "--sketch", str(sketch),
                                     "-o", str(tmp_path / "out")), command="tune build")
    assert str(sketch) in line and "not UTF-8 text (byte" in line and "codec" not in line
    line = assert_one_line_error(run("check", str(sketch)), command="tune check")
    assert str(sketch) in line and "not UTF-8 text (byte" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["", "// only a comment\n"])
def test_an_empty_sketch_exits_1_in_both(tmp_path, content):
    sketch = tmp_path / "empty.tl"
    sketch.write_text(content)
    built = run("build", "--gpu", "t4", "--variant", "mha", "--sketch", str(sketch), "-o", str(tmp_path / "out"))
    checked = run("check", str(sketch))
    assert built.exit_code == checked.exit_code == 1
    assert "error[empty-program]" in built.stderr and "error[empty-program]" in checked.stdout
    assert "Traceback" not in built.output + checked.output


@pytest.mark.parametrize("make,words", [
    (lambda t: t / "missing.tl", "No such file or directory"),
    (lambda t: t, "a directory, not a TL file"),
])
def test_a_sketch_that_cannot_be_read(tmp_path, make, words):
    path = make(tmp_path)
    line = assert_one_line_error(run("build", "--gpu", "t4", "--variant", "mha", "--sketch", str(path),
                                     "-o", str(tmp_path / "out")), command="tune build")
    assert line == f"tune build: error: cannot read sketch {path}: {words}"


# -- the other sub-commands ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,command,words", [
    (["build", "--gpu", "t4", "--variant", "mha", "--params", "{bad json", "-o", "OUT"], "tune build",
     "--params: not valid JSON"),
    (["build", "--gpu", "t4", "--variant", "mha", "--params", "nofile.json", "-o", "OUT"], "tune build",
     "neither a JSON object nor a file"),
    (["build", "--variant", "mha", "-o", "OUT"], "tune build", "Missing option '--gpu'"),
    (["build", "--gpu", "t4", "--variant", "mha", "--head-dim", "wide", "-o", "OUT"], "tune build", "--head-dim"),
    (["build", "--gpu", "t4", "--variant", "mha", "--layout", "bogus", "-o", "OUT"], "tune build", "unknown layout"),
    (["bench", "--gpu", "t4", "--variant", "mha", "--seqlens", "512,abc"], "tune bench", "--seqlens"),
    (["bench", "--gpu", "t4", "--variant", "mha", "--phase", "training"], "tune bench", "--phase"),
    (["check"], "tune check", "Missing argument"),
    (["export", "-o", "OUT"], "tune export", "Missing option '--gpu'"),
    (["nosuchcommand"], "tune", "nosuchcommand"),
])
def test_a_bad_sub_command_input_is_one_line(tmp_path, args, command, words):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    line = assert_one_line_error(run(*args), command=command)
    assert words in line
    assert not (tmp_path / "out").exists()


def test_export_of_a_missing_or_file_study_dir(tmp_path):
    missing = tmp_path / "studies"
    line = assert_one_line_error(run("export", "--gpu", "t4", "--study-dir", str(missing), "-o", str(tmp_path / "x")),
                                 command="tune export")
    assert f"--study-dir {missing} does not exist" in line
    missing.write_text("")
    line = assert_one_line_error(run("export", "--gpu", "t4", "--study-dir", str(missing), "-o", str(tmp_path / "x")),
                                 command="tune export")
    assert f"--study-dir {missing} is not a directory" in line
    assert not (tmp_path / "x").exists()


def test_the_console_script_answers_a_bad_flag_in_one_line(tmp_path):
    """The real entry point (python -m tuner, as the `tune` script): click's usage error, one line, exit 2."""
    proc = subprocess.run([sys.executable, "-m", "tuner", "--gpu", "t4", "--variant", "mha", "--trials", "abc",
                           "--study-dir", str(tmp_path / "s")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("tune: error: ")
    assert "'--trials'" in proc.stderr and "Traceback" not in proc.stderr


# -- the torn journal's message ------------------------------------------------------------------------------------

def test_a_torn_record_message_says_at_once():
    from tuner.campaign.journal import record_problem

    problem = record_problem(b'{"op_code": 1, "x": "a\x01b"}\n')   # json: "Invalid control character at"
    assert problem.startswith("not JSON: Invalid control character at column ") and "at at" not in problem


# -- --help --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["build", "--help"], ["bench", "--help"], ["export", "--help"]])
def test_help_shows_no_type_after_a_flag(args):
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "BOOLEAN" not in result.stdout
    assert "<str>" in result.stdout or "TEXT" in result.stdout   # the options that take a value keep their type


def test_help_states_the_dry_run_budget_and_its_time():
    from tuner.campaign.options import DRY_RUN_TRIALS

    text = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400"}).stdout.split())
    assert f"{DRY_RUN_TRIALS} per combination unless --trials" in text and "about two minutes on a 2-CPU" in text
    assert f"with --dry-run {DRY_RUN_TRIALS}" in text


# -- the dry run's budget and its first line --------------------------------------------------------------------------

def test_a_dry_run_without_trials_gets_the_small_budget_and_a_campaign_keeps_60(tmp_path, monkeypatch):
    import tuner.campaign as campaign_pkg
    from tuner.campaign.options import DEFAULT_TRIALS, DRY_RUN_TRIALS

    seen = []
    monkeypatch.setattr(campaign_pkg, "run_campaign", lambda options: seen.append(options) or 0)
    base = ["--gpu", "t4", "--variant", "mha", "--study-dir", str(tmp_path)]
    assert run(*base, "--dry-run").exit_code == 0
    assert run(*base).exit_code == 0
    assert run(*base, "--dry-run", "--trials", "9").exit_code == 0
    assert [o.trials for o in seen] == [DRY_RUN_TRIALS, DEFAULT_TRIALS, 9]
    assert DEFAULT_TRIALS == 60 and DRY_RUN_TRIALS <= 4


def test_the_dry_run_plan_states_the_budget_and_an_expected_time(monkeypatch):
    from tuner.campaign import driver
    from tuner.campaign.options import CampaignOptions
    from hardware_profiles import load_profile

    monkeypatch.setattr(driver, "local_cpus", lambda: 2)
    camps = [SimpleNamespace(profile=load_profile("t4"))]
    line = driver.dry_run_plan(camps, CampaignOptions(gpu="t4", variant="mla", dry_run=True, trials=2))
    assert line.startswith("dry run: 2 candidate(s) per combination (1 combination(s), 2 kernel(s))")
    assert line.endswith("about 2 min on this machine's 2 CPU(s)")
    many = driver.dry_run_plan(camps * 4, CampaignOptions(gpu="t4", variant="all", dry_run=True, trials=60))
    assert "240 kernel(s)" in many and "--trials sets fewer" in many


def test_a_dry_run_spreads_its_few_candidates_over_the_cpus():
    from tuner.campaign.pacing import dry_run_seconds, dry_run_unit

    assert dry_run_unit(8, remaining=2, free_slots=2) == 1     # one kernel a CPU
    assert dry_run_unit(8, remaining=4, free_slots=2) == 2
    assert dry_run_unit(8, remaining=2, free_slots=1) == 2     # the second unit takes what is left
    assert dry_run_unit(8, remaining=60, free_slots=2) == 8    # a large budget: full units
    assert dry_run_unit(8, remaining=0, free_slots=2) == 1
    assert dry_run_seconds("sm_90a", 2, 2, 8) < dry_run_seconds("sm_75", 2, 2, 8) < 150
    assert dry_run_seconds("sm_75", 60, 2, 8) > 600                   # the old default: ten minutes and more


# -- one count of failures ---------------------------------------------------------------------------------------

def _loop_with_a_duplicate(kind: str):
    """A loop whose candidate (trial 0) has a duplicate in flight (trial 1), ended as ``kind``."""
    import optuna

    from tuner.campaign.loop import Loop
    from tuner.campaign.state import Candidate, Tally

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    first, duplicate = study.ask(), study.ask()
    camp = SimpleNamespace(name="s", study=study, tally=Tally(), inflight=1)
    loop = Loop.__new__(Loop)
    loop.waiting = {"k": [(camp, duplicate)]}
    cand = Candidate(camp, first, None, "fa2", "k")
    first.set_user_attr("kernel_name", "attn_x")
    if kind == "compiled":
        loop._finish_candidate(cand, compiled=True)
    elif kind == "infeasible":
        loop._finish_candidate(cand, infeasible="compile: ptxas error")
    else:
        loop._finish_candidate(cand, "compile task lost: LocalRayletDiedError")
    return study.trials[1], camp


@pytest.mark.parametrize("kind,state", [("compiled", "PRUNED"), ("infeasible", "PRUNED"), ("lost", "FAIL")])
def test_a_duplicate_asked_in_flight_is_no_failure(kind, state):
    from tuner.campaign.finish import trial_rows

    trial, camp = _loop_with_a_duplicate(kind)
    assert trial.state.name == state and trial.user_attrs["duplicate_of"] == 0
    assert camp.tally.failed == 0 and camp.inflight == 0
    assert camp.tally.cached == (0 if kind == "lost" else 1)
    row = trial_rows(camp.study)[1]
    assert row["state"] == {"compiled": "cached", "infeasible": "cached", "lost": "duplicate"}[kind]
    if kind == "infeasible":
        assert trial.user_attrs["infeasible_reason"] == "compile: ptxas error"


def test_the_last_lines_count_as_the_live_line_does():
    from tuner.campaign.finish import counts_line
    from tuner.campaign.liveview import LiveView
    from tuner.campaign.state import Tally

    tally = Tally(done=3, infeasible=1, failed=2, cached=5)
    view = LiveView("t4", plain=True)
    view.update(3, 1, 2, None, None, None, 10.0, None, cached=5)
    counts = "3 done, 1 infeasible, 2 failed, 5 cached"
    assert f"trials {counts} |" in view.line()
    assert counts_line(tally).startswith(f"trials {counts} (2 failed: lost to the infrastructure")
    assert counts_line(Tally(done=4)) == "trials 4 done, 0 infeasible, 0 failed"


# -- next: ------------------------------------------------------------------------------------------------------------

def _camps(dry_run: bool, study_dir: Path, model=None, **changes):
    from hardware_profiles import load_profile
    from tuner.campaign.options import CampaignOptions

    opts = CampaignOptions(gpu="t4", variant=None if model else "mla", model=model, dry_run=dry_run,
                           study_dir=study_dir, **changes)
    return [SimpleNamespace(options=opts, profile=load_profile("t4"), name="t4-mla-fp16-d192x128-causal-dryrun",
                            spec=SimpleNamespace(variant="mla"))]


def test_next_after_a_dry_run(tmp_path):
    from tuner.campaign.finish import next_step

    line = next_step(_camps(True, tmp_path), 0, None)
    assert line.startswith("next: on a machine with the GPU (NVIDIA T4), run the same command without --dry-run")
    assert f"tune --gpu t4 --variant mla --study-dir {tmp_path}" in line
    assert next_step(_camps(True, tmp_path), 1, None).startswith("next: no candidate compiled; tune build --gpu t4")
    line = next_step(_camps(True, tmp_path, dtype="fp8", layout="varlen"), 0, None)   # the same command, every flag
    assert f"tune --gpu t4 --variant mla --dtype fp8 --layout varlen --study-dir {tmp_path}" in line
    line = next_step(_camps(True, tmp_path, phase="decode", kv_dtype="fp8"), 0, None)
    assert f"--variant mla --phase decode --kv-dtype fp8 --study-dir {tmp_path}" in line
    line = next_step(_camps(True, tmp_path, dtype="fp8", layout="paged", page_size=16), 0, None)
    assert f"tune --gpu t4 --variant mla --dtype fp8 --layout paged --page-size 16 --study-dir {tmp_path}" in line


def test_next_after_a_campaign(tmp_path):
    from tuner.campaign.finish import next_step

    report = tmp_path / "study" / "report.md"
    line = next_step(_camps(False, tmp_path), 0, report)
    assert line == (f"next: tune export --gpu t4 --study-dir {tmp_path} -o exported/ (the stored kernels, for "
                    f"serving); report: {report}")
    assert "the report says why" in next_step(_camps(False, tmp_path), 1, report)


# -- the real thing (nvcc, Ray) ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_default_dry_run_says_its_plan_counts_and_next_step(tmp_path):
    """`tune --gpu h100 --variant mha --dry-run` (the fastest target to compile, ~25 s a kernel on 2 CPUs) with the
    default budget: the plan first, the live line's counts last, then next:."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    from tuner.campaign.options import DRY_RUN_TRIALS

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tuner", "--gpu", "h100", "--variant", "mha", "--dry-run",
                           "--study-dir", str(tmp_path / "s")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out.startswith(f"dry run: {DRY_RUN_TRIALS} candidate(s) per combination") and "CPU(s)" in out
    assert f"dry run: trials {DRY_RUN_TRIALS} done, 0 infeasible, 0 failed" in out
    assert "next: on a machine with the GPU (NVIDIA H100" in out and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_campaign_on_a_machine_without_the_gpu_is_one_line_and_leaves_no_study(tmp_path):
    """Ray starts, finds no T4: one line naming --dry-run, exit 2, and neither the study dir nor a journal stays
    (an empty journal left behind made nothing easier)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "tuner", "--gpu", "t4", "--variant", "mha", "--study-dir",
                           str(tmp_path / "s")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tune: error: the Ray cluster has no T4 GPU" in proc.stderr and "--dry-run" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "s").exists()


def test_help_read_by_a_pager_that_stops_early_is_no_traceback():
    """`tune --help | head -1`: the closed pipe ends the command quietly (it once raised an AttributeError from an
    exception class the vendored click lacks)."""
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="120"))
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "AttributeError" not in err, err
