import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from store_fakes import make_record
from tuner.store.records import (CorruptRecordError, InvalidRecordError, KernelStore, UnverifiedKernelError)


def _hidden_leftovers(root: Path) -> list[Path]:
    return [p for p in (root / "kernels").rglob(".*") if p.name != ".lock"]


def test_offer_stores_every_part_of_the_record(tmp_path):
    store = KernelStore(tmp_path)
    rec = make_record()
    assert store.offer(rec) is True
    d = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096"
    assert (d / "kernel.cubin").read_bytes() == rec.cubin
    assert (d / "kernel.cu").read_text() == rec.source
    assert (d / "program.tl").read_text() == rec.tl_program
    assert json.loads((d / "verification.json").read_text()) == rec.verification
    meta = json.loads((d / "record.json").read_text())
    assert meta["kernel_sha256"] == rec.kernel_sha256
    assert "cubin" not in meta and "source" not in meta and "tl_program" not in meta
    assert store.records() == [rec]


def test_offer_keeps_the_better_kernel_per_key(tmp_path):
    store = KernelStore(tmp_path)
    assert store.offer(make_record(tflops=300.0, cubin=b"A"))
    assert store.offer(make_record(tflops=290.0, cubin=b"B")) is False      # slower: kept out
    assert store.offer(make_record(tflops=300.0, cubin=b"C")) is False      # a tie keeps the incumbent
    assert [r.cubin for r in store.records()] == [b"A"]
    assert store.offer(make_record(tflops=320.5, cubin=b"D")) is True       # faster: replaces
    (only,) = store.records()
    assert (only.cubin, only.tflops) == (b"D", 320.5)
    assert _hidden_leftovers(tmp_path) == []


def test_replace_writes_what_a_re_timing_decided_whatever_the_recorded_tflops_say(tmp_path):
    """The campaign's way in: both kernels were timed again side by side, so a record whose own (noisy)
    number is lower may replace; only if the store still holds the kernel the decision was taken against."""
    store = KernelStore(tmp_path)
    first = make_record(tflops=310.0, cubin=b"A")
    assert store.replace(first, None) is True
    assert store.replace(make_record(tflops=400.0, cubin=b"B"), None) is False          # something is stored now
    confirmed = make_record(tflops=305.0, cubin=b"C", confirmation={"vs_stored": {"ratio": 1.04, "low": 1.02,
                                                                                  "confirmed": True}})
    assert store.replace(confirmed, "0" * 64) is False                                   # not what is stored
    assert [r.cubin for r in store.records()] == [b"A"]
    assert store.replace(confirmed, first.kernel_sha256) is True
    (only,) = store.records()
    assert only.cubin == b"C" and only.tflops == 305.0 and only.confirmation["vs_stored"]["low"] == 1.02
    with pytest.raises(UnverifiedKernelError):
        store.replace(make_record(verification={"passed": False}), only.kernel_sha256)
    assert _hidden_leftovers(tmp_path) == []


def test_a_record_written_before_confirmations_existed_loads_without_one(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record())
    path = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096/record.json"
    data = json.loads(path.read_text())
    del data["confirmation"]
    path.write_text(json.dumps(data))
    assert store.records()[0].confirmation == {}


def test_each_bucket_and_spec_is_its_own_key(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record(bucket="s512", tflops=200.0))
    store.offer(make_record(bucket="s16384", tflops=100.0))
    store.offer(make_record(causal=False, tflops=50.0))
    store.offer(make_record(variant="gqa", tflops=60.0))
    store.offer(make_record(arch="sm80", gpu="a100", device_name="NVIDIA A100-SXM4-80GB", tflops=70.0))
    best = store.best("sm90", "mha", "bf16", 128, 128, True)
    assert list(best) == ["s512", "s16384"]
    assert best["s16384"].tflops == 100.0
    assert {r.variant for r in store.records(arch="sm90")} == {"mha", "gqa"}
    assert [r.gpu for r in store.records(gpu="a100")] == ["a100"]
    assert len(store.records(variant="mha")) == 4
    assert store.best("sm90", "mha", "fp16", 128, 128, True) == {}


@pytest.mark.parametrize("verification", [{"passed": False}, {}, {"passed": "yes"}, {"passed": 1}, None])
def test_unverified_kernel_is_never_written(tmp_path, verification):
    store = KernelStore(tmp_path)
    with pytest.raises(UnverifiedKernelError, match="did not pass verification"):
        store.offer(make_record(verification=verification, tflops=9999.0))
    assert not (tmp_path / "kernels/sm90").exists()
    assert store.records() == []


@pytest.mark.parametrize("tflops", [float("nan"), float("inf"), 0.0, -1.0, None])
def test_record_without_usable_tflops_is_refused(tmp_path, tflops):
    with pytest.raises(InvalidRecordError, match="tflops"):
        KernelStore(tmp_path).offer(make_record(tflops=tflops))
    assert KernelStore(tmp_path).records() == []


def test_record_with_empty_cubin_or_bad_bucket_is_refused(tmp_path):
    store = KernelStore(tmp_path)
    with pytest.raises(InvalidRecordError, match="cubin is empty"):
        store.offer(make_record(cubin=b""))
    with pytest.raises(InvalidRecordError, match="bucket"):
        store.offer(make_record(bucket="../../etc"))


def test_nan_baseline_is_stored_as_missing(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record(baselines={"flash": None, "cudnn": float("nan"), "efficient": 140.0}))
    (r,) = store.records()
    assert r.baselines == {"flash": None, "cudnn": None, "efficient": 140.0}


def test_a_failing_write_leaves_the_old_record_and_no_partial_dir(tmp_path, monkeypatch):
    import tuner.store.records as store_mod

    store = KernelStore(tmp_path)
    store.offer(make_record(tflops=100.0, cubin=b"old"))
    real = store_mod._write_file

    def flaky(path, data):
        if path.name == "record.json":
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(store_mod, "_write_file", flaky)
    with pytest.raises(OSError, match="No space"):
        store.offer(make_record(tflops=200.0, cubin=b"new"))
    monkeypatch.undo()
    assert [r.cubin for r in store.records()] == [b"old"]
    assert _hidden_leftovers(tmp_path) == []


def test_a_failing_first_write_leaves_nothing(tmp_path, monkeypatch):
    import tuner.store.records as store_mod

    monkeypatch.setattr(store_mod, "_write_file", lambda p, d: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError):
        KernelStore(tmp_path).offer(make_record())
    shape = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal"
    assert list(shape.iterdir()) == []


# A writer killed with SIGKILL at a chosen point of its commit, in a real child process.
_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = [{repo!r}, {here!r}]
    from store_fakes import make_record
    import tuner.store.records as store_mod
    point = {point!r}
    real_rename, real_write = os.rename, store_mod._write_file
    renames = []
    def rename(src, dst):
        renames.append(dst)
        if point == "between-renames" and len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        real_rename(src, dst)
    def write(path, data):
        if point == "mid-write" and path.name == "program.tl":
            with open(path, "wb") as fh:
                fh.write(data[:3])       # half a file, then death
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(path, data)
    store_mod.os.rename = rename
    store_mod._write_file = write
    store_mod.KernelStore({root!r}).offer(make_record(tflops=500.0, cubin=b"new"))
""")


@pytest.mark.slow   # a process killed or racing mid-write: ~3 s each, the full tier's
@pytest.mark.parametrize("point", ["mid-write", "between-renames"])
def test_kill_9_during_a_replace_keeps_the_old_record(tmp_path, point):
    store = KernelStore(tmp_path)
    store.offer(make_record(tflops=100.0, cubin=b"old"))
    repo = str(Path(__file__).resolve().parents[2])
    script = _KILLER.format(repo=repo, here=str(Path(__file__).parent), point=point, root=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # Readers see the last committed record, whole.
    assert [(r.cubin, r.tflops) for r in store.records()] == [(b"old", 100.0)]
    assert _hidden_leftovers(tmp_path), "the kill should have left the writer's scratch behind"
    # The next writer recovers and cleans up.
    assert store.offer(make_record(tflops=50.0, cubin=b"slow")) is False
    assert _hidden_leftovers(tmp_path) == []
    assert [r.cubin for r in store.records()] == [b"old"]


def test_corrupt_record_json_names_the_file(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record())
    path = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096/record.json"
    path.write_text('{"arch": "sm90", ')
    with pytest.raises(CorruptRecordError, match=f"{path}: not valid JSON"):
        store.records()


def test_record_json_missing_fields_names_them(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record())
    path = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096/record.json"
    data = json.loads(path.read_text())
    del data["tflops"], data["verification"]
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptRecordError, match="missing field\\(s\\): verification, tflops"):
        store.best("sm90", "mha", "bf16", 128, 128, True)


def test_tampered_cubin_is_caught_by_its_hash(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record())
    cubin = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096/kernel.cubin"
    cubin.write_bytes(b"something else")
    with pytest.raises(CorruptRecordError, match="kernel.cubin: sha256 .* does not match"):
        store.records()


def test_missing_cubin_names_the_file(tmp_path):
    store = KernelStore(tmp_path)
    store.offer(make_record())
    cubin = tmp_path / "kernels/sm90/mha/bf16-d128x128-causal/s4096/kernel.cubin"
    cubin.unlink()
    with pytest.raises(CorruptRecordError, match=str(cubin)):
        store.records()


def test_empty_store_has_no_records(tmp_path):
    assert KernelStore(tmp_path / "nowhere").records() == []
    assert KernelStore(tmp_path / "nowhere").best("sm90", "mha", "bf16", 128, 128, True) == {}
