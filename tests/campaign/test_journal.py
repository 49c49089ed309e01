"""A torn or corrupt journal: a torn last record is cut off under Optuna's lock with a
backup, a corrupt record before it is an error naming the line, a writer mid-append is never "repaired",
and a campaign resumes from a torn journal."""
import re
import subprocess
import sys
import textwrap
import time

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from typer.testing import CliRunner

from tuner.campaign import run_campaign
from tuner.campaign.journal import JournalError, check_journal, first_corrupt
from tuner.campaign.study import StudyError, make_storage
from tuner.commands.cli import app

from .conftest import GRID, REPO, STUDY, load_study, replay_options

optuna.logging.set_verbosity(optuna.logging.WARNING)


def write_journal(path, trials=3) -> bytes:
    """A real Optuna journal: a study and ``trials`` finished trials; its bytes."""
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(path))), study_name="s",
                                direction="maximize")
    for i in range(trials):
        trial = study.ask()
        trial.suggest_int("block_n", 64, 128, step=64)
        study.tell(trial, float(i))
    return path.read_bytes()


def optuna_reads(path):
    """The study as Optuna alone reads the file (reading appends nothing)."""
    return optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))


def lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def backups(path):
    return sorted(path.parent.glob(f"{path.name}.torn-*.bak"))


# -- a torn last record --------------------------------------------------------------------------------


def test_a_healthy_or_missing_journal_is_left_alone(tmp_path):
    assert check_journal(tmp_path / "none.journal") is None and not (tmp_path / "none.journal").exists()
    path = tmp_path / "s.journal"
    healthy = write_journal(path)
    assert check_journal(path) is None
    assert path.read_bytes() == healthy and not backups(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.journal"]     # the lock is given back


@pytest.mark.parametrize("tail", [
    pytest.param(lambda last: last[:len(last) // 2], id="half a record"),
    pytest.param(lambda last: last[:-1], id="all but its newline"),
    pytest.param(lambda last: b"\0" * 300, id="zeros (a power loss)"),
    pytest.param(lambda last: last[:len(last) // 2] + b"\n", id="a line that is not JSON"),
    pytest.param(lambda last: b'["op_code", 5]\n', id="JSON but not a record"),
])
def test_a_torn_last_record_is_cut_off_with_a_backup_and_optuna_appends_after_it(tmp_path, tail):
    path = tmp_path / "s.journal"
    records = lines(write_journal(path))
    complete = b"".join(records)
    torn = complete + tail(records[-1])       # the next record's write, interrupted
    path.write_bytes(torn)

    cut = check_journal(path)
    assert cut is not None and cut.path == path
    assert (cut.kept, cut.dropped) == (len(complete), len(torn) - len(complete))
    assert path.read_bytes() == complete and cut.backup.read_bytes() == torn and backups(path) == [cut.backup]
    message = cut.message()
    assert str(path) in message and f"{cut.dropped} bytes" in message and str(cut.backup) in message
    # What matters: Optuna appends after the last complete record, and reads the journal back.
    study = optuna.load_study(study_name="s", storage=make_storage(str(path), tmp_path, "s"))
    study.set_user_attr("resumed", True)
    assert optuna_reads(path).user_attrs == {"resumed": True} and len(optuna_reads(path).trials) == 3
    assert check_journal(path) is None


def test_without_the_cut_optuna_corrupts_a_torn_journal(tmp_path):
    """Why: Optuna's next append lands on the torn line, and the journal cannot be read from then on."""
    path = tmp_path / "s.journal"
    records = lines(write_journal(path))
    path.write_bytes(b"".join(records) + records[-1][:40])
    study = optuna_reads(path)
    study.set_user_attr("a", 1)              # written onto the torn line
    with pytest.raises(ValueError):          # JSONDecodeError: written, then read back
        study.set_user_attr("b", 2)
    with pytest.raises(ValueError):
        optuna_reads(path)
    with pytest.raises(JournalError, match=rf"line {len(records) + 1} \(not JSON"):
        check_journal(path)


def test_make_storage_says_in_one_line_on_stderr_what_it_cut(tmp_path, capsys):
    path = tmp_path / "s.journal"
    data = write_journal(path)
    path.write_bytes(data + b'{"op_code":')
    make_storage(None, tmp_path, "s")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"tune: journal {path}: cut off a torn last record (11 bytes, ")
    assert str(backups(path)[0]) in err[0]


# -- a corrupt record before the last ------------------------------------------------------------------


def test_a_corrupt_record_in_the_middle_is_an_error_naming_the_line_and_the_way_back(tmp_path):
    path = tmp_path / "s.journal"
    records = lines(write_journal(path, trials=4))
    records[3] = records[3][:25] + b"#" + records[3][26:]
    damaged = b"".join(records) + b'{"op_code": 8, "trunc'     # and a torn tail: still nothing is cut
    path.write_bytes(damaged)
    with pytest.raises(JournalError) as info:
        check_journal(path)
    message = str(info.value)
    assert f"journal {path} is corrupt at line 4 (not JSON: " in message and "\n" not in message
    assert "nothing was changed" in message and "restore a copy from before the damage" in message
    assert path.read_bytes() == damaged and not backups(path)
    # The advice works: cut at that line, and the records before it are a journal Optuna reads.
    command = re.search(r"cp \S+ \S+ && truncate -s \d+ \S+$", message).group(0)
    subprocess.run(command, shell=True, check=True)
    assert (tmp_path / "s.journal.corrupt").read_bytes() == damaged
    assert path.read_bytes() == b"".join(records[:3]) and check_journal(path) is None
    assert len(optuna_reads(path).trials) == 1


def test_first_corrupt_reads_lines_as_optuna_does():
    good = b'{"op_code":0}\n'
    assert first_corrupt(b"") is None and first_corrupt(good * 3) is None
    assert first_corrupt(good + b"\n" + good)[:2] == (2, len(good))                 # an empty line
    assert first_corrupt(good + b'{"op_code":0}\r{"op_code":1}\n')[:2] == (2, len(good))  # \r ends no line
    assert first_corrupt(good + b"\xff\xfe\n")[2] == "not UTF-8 text"


def test_resume_of_a_corrupt_journal_exits_2_without_a_traceback(tmp_path):
    journal = tmp_path / f"{STUDY}.journal"
    records = lines(write_journal(journal))
    journal.write_bytes(b"".join(records[:2]) + b"garbage\n" + b"".join(records[2:]))
    result = CliRunner().invoke(app, ["--gpu", "h100", "--variant", "mha", "--resume", "--study-dir", str(tmp_path),
                                      "--backend", f"replay:{GRID}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"tune: error: journal {journal} is corrupt at line 3 (not JSON: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    with pytest.raises(StudyError, match="corrupt at line 3"):
        make_storage(None, tmp_path, STUDY)


# -- a concurrent writer -------------------------------------------------------------------------------

HALF_WRITER = textwrap.dedent("""
    import sys, time
    from optuna.storages import journal
    path, ready, lock_kind = sys.argv[1:]
    lock = getattr(journal, lock_kind)(path)
    record = b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"late":true}}\\n'
    lock.acquire()
    with open(path, "ab") as f:          # as JournalFileBackend.append_logs, with a pause mid-record
        f.write(record[:30]); f.flush()
        open(ready, "w").close()
        time.sleep(1.5)
        f.write(record[30:]); f.flush()
    lock.release()
""")


@pytest.mark.slow   # a process killed or racing mid-write: ~3 s each, the full tier's
@pytest.mark.parametrize("lock_kind", ["JournalFileSymlinkLock", "JournalFileOpenLock"])
def test_a_record_being_appended_under_the_lock_is_not_torn(tmp_path, lock_kind):
    path, ready = tmp_path / "s.journal", tmp_path / "ready"
    healthy = write_journal(path)
    writer = subprocess.Popen([sys.executable, "-c", HALF_WRITER, str(path), str(ready), lock_kind], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert writer.poll() is None and time.monotonic() < deadline, "the writer did not start"
            time.sleep(0.01)
        assert len(path.read_bytes()) == len(healthy) + 30      # a half record is there, under the lock
        assert check_journal(path) is None                      # it waited for the writer
    finally:
        assert writer.wait(timeout=60) == 0
    assert not backups(path) and path.read_bytes().startswith(healthy)
    assert optuna_reads(path).user_attrs == {"late": True}


APPENDER = textwrap.dedent("""
    import sys
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    path, count = sys.argv[1], int(sys.argv[2])
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(path)))
    for i in range(count):               # large records: each write takes a while
        study.set_user_attr(f"k{i}", "x" * 400_000)
    print("done")
""")


def test_a_journal_appended_to_by_optuna_meanwhile_is_never_repaired(tmp_path):
    path = tmp_path / "s.journal"
    write_journal(path)
    writer = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), "40"], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    checks = 0
    try:
        while writer.poll() is None:
            assert check_journal(path) is None and not backups(path)
            checks += 1
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out.strip() == "done" and checks > 0
    assert check_journal(path) is None and not backups(path)
    assert len(optuna_reads(path).user_attrs) == 40


# -- a campaign resumes --------------------------------------------------------------------------------


def tear_last_record(journal) -> bytes:
    """Cut the journal's last record in the middle of its JSON, as an interrupted write leaves it."""
    data = journal.read_bytes()
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    torn = data[:start + (len(data) - start) // 2]
    journal.write_bytes(torn)
    return torn


@pytest.mark.slow
def test_a_campaign_resumes_from_a_torn_journal(ray_cluster, tmp_path, capsys):
    assert run_campaign(replay_options(tmp_path, trials=4)) == 0
    journal = tmp_path / f"{STUDY}.journal"
    torn = tear_last_record(journal)
    as_torn = optuna.load_study(study_name=STUDY, storage=JournalStorage(JournalFileBackend(str(journal))))
    before = {t.number: t.value for t in as_torn.trials if t.state == TrialState.COMPLETE}
    assert before and journal.read_bytes() == torn
    capsys.readouterr()

    # Optuna alone would append the resume's first record onto the torn line, then fail to read the journal.
    assert run_campaign(replay_options(tmp_path, trials=6, resume=True)) == 0
    err = capsys.readouterr().err
    [backup] = backups(journal)
    assert backup.read_bytes() == torn                                  # the original, byte for byte
    cut = len(torn) - (torn.rfind(b"\n") + 1)
    line = next(line for line in err.splitlines() if "torn" in line)
    assert str(journal) in line and f"{cut} bytes" in line and str(backup) in line

    study = load_study(tmp_path)
    assert {t.number: t.value for t in study.trials if t.number in before} == before    # nothing else lost
    assert len([t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) >= 6
    # ... and the journal stays healthy: a second resume neither cuts nor fails.
    assert run_campaign(replay_options(tmp_path, trials=7, resume=True)) == 0
    assert "torn" not in capsys.readouterr().err and backups(journal) == [backup]
