# pytest puts this folder on sys.path (no __init__.py here), so tests in subfolders can import the
# shared helpers beside this file, e.g. `from sketch_edits import moved_prefetch`.
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Bytecode, and pytest's test modules with their asserts rewritten, are cached in __pycache__ even where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machines): rewriting the asserts of ~230 modules otherwise costs every
# run, and every parallel worker, about 15 s.
sys.dont_write_bytecode = False

# The GPU locks (tuner/campaign/gpulock.py) of this test process and the Ray workers and trial processes it starts:
# a folder of its own, so that another test run, a campaign or a parallel test worker on this machine never holds
# the lock a test waits for. Set in every process that loads this file, never inherited: pytest-xdist's workers
# start from the controller's environment, which has loaded this file first (with setdefault, all workers shared
# the controller's folder, and a hung-trial test found another worker's campaign holding "gpu-0").
os.environ["TUNER_GPU_LOCK_DIR"] = tempfile.mkdtemp(prefix=f"tuner-test-locks-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")

# With parallel workers (pytest -n, pytest-xdist with --dist loadgroup), the tests that start Ray clusters run one
# after another in one worker: two local clusters at once on a 2-core machine slow each other past the tests' time
# limits. They are the users of the campaign tests' session cluster and the files that start their own.
SERIAL_GROUP = "ray"
_SERIAL_FILES = ("test_compile_pool.py", "test_trialproc.py", "test_retime.py", "test_newcomer_path.py",
                 "test_decode_bench_cli.py")


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()) or Path(str(item.fspath)).name in _SERIAL_FILES:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


@pytest.fixture
def fa4_stand_in(tmp_path, monkeypatch):
    """``flash_attn.cute`` importable: the CPU stand-in of tests/fa4_stand_in.py, from a temporary folder
    on sys.path. Yields the module (its knobs: RETURN_LSE, WRONG, CALLS)."""
    package = tmp_path / "fa4site" / "flash_attn"
    (package / "cute").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parent / "fa4_stand_in.py", package / "cute" / "__init__.py")
    for name in ("flash_attn", "flash_attn.cute"):   # a real FA2/FA4 imported earlier must not answer
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(package.parent))
    import flash_attn.cute as module

    yield module
    for name in ("flash_attn.cute", "flash_attn"):
        sys.modules.pop(name, None)


@pytest.fixture
def fa4_missing(monkeypatch):
    """``flash_attn.cute`` not importable, whatever this machine has installed."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
