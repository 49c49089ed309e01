"""Kernels built with options (a window, a cap, sinks) in the store: kept beside the plain kernel of the same
shape and bucket, never in its place, and read back with their options."""
from store_fakes import make_record

from tuner.store.records import KernelStore


def _record(features=(), tflops=300.0):
    r = make_record(variant="gqa", bucket="s4096", tflops=tflops, cubin=f"cubin {'+'.join(features)}".encode())
    r.kernel_meta["spec"] = {"causal": True, "d_qk": 128, "d_v": 128, "dtype": "bf16", "layout": "dense",
                             **{f: True for f in features}}
    return r


def test_an_option_kernel_never_takes_the_plain_kernels_place(tmp_path):
    store = KernelStore(tmp_path)
    assert store.offer(_record(tflops=300.0))
    assert store.offer(_record(("local", "sinks"), tflops=100.0))    # slower, but another key
    assert store.offer(_record(("softcap",), tflops=120.0))
    assert not store.offer(_record(("local", "sinks"), tflops=90.0))
    plain = store.best("sm90", "gqa", "bf16", 128, 128, True)
    local = store.best("sm90", "gqa", "bf16", 128, 128, True, features=("local", "sinks"))
    assert plain["s4096"].cubin == b"cubin " and plain["s4096"].features == ()
    assert local["s4096"].cubin == b"cubin local+sinks" and local["s4096"].tflops == 100.0
    assert sorted(r.features for r in store.records()) == [(), ("local", "sinks"), ("softcap",)]
    assert (tmp_path / "kernels/sm90/gqa/bf16-d128x128-causal-local-sinks/s4096").is_dir()
