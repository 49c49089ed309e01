"""`tune bench --layout varlen|paged` with --window / --softcap / --sinks (or a preset's layer): the visible pairs a
windowed mix counts, the options given to our kernel and to FA4, the libraries that have no form for one ("n/a"
with the reason), SDPA's window mask, and the command end to end with a CPU stand-in kernel (no GPU)."""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field

import pytest
import torch

from kernel_abi.spec import visible_pairs
from tuner.commands import bench_serving
from tuner.measure import serving, serving_baselines
from tuner.measure.mixes import MixError, ServingProblem
from tuner.measure.reference import reference
from tuner.measure.serving_inputs import make_mix_inputs

import test_bench_mixes as mixes_tests   # noqa: E402 (its stand-in command, timer and CLI runner)

PLAIN = ServingProblem("varlen", "tiny", (5, 33, 1), (5, 40, 1), "gqa", 4, 2, 64, 64, True, "bf16")
WINDOWED = dataclasses.replace(PLAIN, window=(8, 0), softcap=50.0)
SINKS = dataclasses.replace(PLAIN, window=(8, 0), sinks=True)
PAGED = ServingProblem("paged", "tiny-prefix", (3, 20), (40, 20), "gqa", 4, 2, 64, 64, True, "bf16", 16,
                       window=(6, 0))


@dataclass
class OptionKernel:
    """AttentionKernel's varlen and paged signatures with the options, computed by the fp32 reference; records the
    option keywords of each call."""

    causal: bool = True
    calls: list = field(default_factory=list)

    def _run(self, q, keys, values, cu_q, scale, options):
        self.calls.append(options)
        outs = [reference(q[cu_q[b]:cu_q[b + 1]][None], kb[None], vb[None], self.causal, scale=scale,
                          window=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0),
                          sinks=options.get("sinks"))[0] for b, (kb, vb) in enumerate(zip(keys, values))]
        return torch.cat(outs).to(q.dtype)

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=None, softmax_scale=None, out=None, **options):
        n = len(cu_k) - 1
        return self._run(q, [k[cu_k[b]:cu_k[b + 1]] for b in range(n)], [v[cu_k[b]:cu_k[b + 1]] for b in range(n)],
                         cu_q, softmax_scale, options)

    def paged(self, q, kc, vc, cu_q, used, table, max_q, softmax_scale=None, out=None, **options):
        keys = [kc[table[b].long()].flatten(0, 1)[:int(used[b])] for b in range(len(used))]
        values = [vc[table[b].long()].flatten(0, 1)[:int(used[b])] for b in range(len(used))]
        return self._run(q, keys, values, cu_q, softmax_scale, options)


def test_a_windowed_mix_counts_the_pairs_its_window_leaves_visible():
    # (5, 5) sees 1+2+3+4+5 with 4 keys left of the diagonal, (33 on 40) 5 a row, (1, 1) one
    assert dataclasses.replace(PLAIN, window=(4, 0)).pairs == 15 + 33 * 5 + 1
    assert WINDOWED.pairs == sum(visible_pairs(q, k, 8, 0) for q, k in zip(PLAIN.seqlens_q, PLAIN.seqlens_k))
    assert WINDOWED.pairs < PLAIN.pairs and WINDOWED.flops == 2 * 4 * WINDOWED.pairs * 128
    assert WINDOWED.label().endswith("window 8,0 softcap 50")


@pytest.mark.parametrize("changes, needle", [(dict(window=(8, 3)), "right side is 0"), (dict(softcap=-1.0), "softcap"),
                                             (dict(window=(8,)), r"a \(left, right\) pair")])
def test_a_mix_refuses_options_that_are_not_attention(changes, needle):
    with pytest.raises(MixError, match=needle):
        dataclasses.replace(PLAIN, **changes)


def test_ours_and_fa4_get_the_window_and_cap_and_sdpa_is_not_applicable(fa4_stand_in, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    kernel = OptionKernel()
    row = serving.mix_row(kernel, WINDOWED, device="cpu", clock=mixes_tests.Timer())
    assert row["status"] == "ok" and row["cross_check_against"] == "fa4", row
    assert kernel.calls[0] == {"window_size": (8, 0), "softcap": 50.0}
    assert any(c.get("window_size") == (8, 0) and c.get("softcap") == 50.0 for c in fa4_stand_in.CALLS)
    assert row["fa4_max_abs_diff"] < 2e-2 and row["fa4"] == row["ours"]
    assert row["sdpa"] is None and row["sdpa_err"] == "not applicable: SDPA has no soft-capping"
    assert (row["window"], row["softcap"], row["sinks"]) == ([8, 0], 50.0, False)
    assert row["flops"] == WINDOWED.flops


def test_sinks_reach_ours_and_fa4_alike_and_flashinfer_has_none(fa4_stand_in):
    kernel = OptionKernel()
    row = serving.mix_row(kernel, SINKS, device="cpu", clock=mixes_tests.Timer())
    assert row["status"] == "ok" and row["cross_check_against"] == "fa4", row
    ours_sinks = kernel.calls[0]["sinks"]
    fa4_sinks = next(c["learnable_sink"] for c in fa4_stand_in.CALLS if c.get("learnable_sink") is not None)
    assert ours_sinks.shape == (4,) and torch.equal(fa4_sinks.float(), ours_sinks)   # bf16-exact logits
    assert row["flashinfer_err"] == "not applicable: FlashInfer's batch prefill takes no attention sinks"
    assert row["sdpa_err"] == "not applicable: SDPA has no attention sinks"


def test_a_wrong_windowed_kernel_is_failed_against_fa4(fa4_stand_in, monkeypatch):
    """A kernel that ignores the window is caught by the cross-check, not timed."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)

    class Ignores(OptionKernel):
        def varlen(self, *args, **options):
            return super().varlen(*args, **{k: v for k, v in options.items() if k != "window_size"})

    row = serving.mix_row(Ignores(), WINDOWED, device="cpu", clock=mixes_tests.Timer())
    assert row["status"] == "FAILED" and "differs from fa4" in row["reason"] and row["ours"] is None


def test_sdpa_takes_a_window_as_an_explicit_mask_over_the_pages(fa4_stand_in, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    row = serving.mix_row(OptionKernel(), PAGED, device="cpu", clock=mixes_tests.Timer())
    assert row["status"] == "ok" and row["cross_check_against"] == "sdpa", row
    assert row["sdpa_note"].startswith("explicit mask of the window") and row["sdpa_max_abs_diff"] < 2e-2
    x = make_mix_inputs(PAGED, "cpu")
    mask = serving_baselines.padded_mask(PAGED, "cpu")
    # the 20-query sequence on 20 keys: row 10 sees keys 4..10 (6 left of its diagonal, none right)
    assert mask[1, 0, 10].nonzero().flatten().tolist() == list(range(4, 11))
    assert x.q.shape[0] == 23


def test_the_command_builds_and_times_a_presets_window_on_the_mixes(monkeypatch, tmp_path, fa4_stand_in):
    from tuner.build import NO_OPTIONS
    from tuner.commands.bench import preset_options

    monkeypatch.setitem(sys.modules, "flashinfer", None)
    mixes_tests._stand_in_command(monkeypatch, tmp_path)
    targets = []
    original = bench_serving.build.build_kernels
    monkeypatch.setattr(bench_serving.build, "build_kernels",
                        lambda t, *a, **kw: (targets.extend(s for _, s in t), original(t, *a, **kw))[1])
    monkeypatch.setattr(bench_serving, "_load_and_verify", lambda built: (
        [OptionKernel(causal=b.spec.causal) for b in built],
        {b.spec.label(): {"name": "standin", "verified": True, "reason": ""} for b in built}))
    out = tmp_path / "local.json"
    result = mixes_tests.invoke("bench", "--gpu", "h100", "--model", "mistral-7b-v0.1", "--layout", "paged",
                                "--page-size", "16", "--json", str(out))
    assert result.exit_code == 0, result.output
    window = preset_options("mistral-7b-v0.1", None, NO_OPTIONS)[0].window_for(True)
    assert window[0] > 0 and targets and all(s.local and not s.softcap and s.layout == "paged" for s in targets)
    record = json.loads(out.read_text())
    assert record["rows"] and all(r["window"] == list(window) and r["status"] == "ok" for r in record["rows"])
    assert all(r["sdpa"] > 0 and r["fa4"] > 0 and r["sdpa_note"].startswith("explicit mask of the window")
               for r in record["rows"])
    assert f"window {window[0]},0" in result.stdout


def test_a_capped_mix_shows_n_a_for_the_library_that_cannot_run_it(fa4_stand_in, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    row = serving.mix_row(OptionKernel(), WINDOWED, device="cpu", clock=mixes_tests.Timer())
    text = mixes_tests._render(bench_serving.results_table([row], "t"))
    assert "n/a" in text and "not applicable: SDPA has no soft-capping" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (the serving layouts build warp-specialised sm90 kernels)")
@pytest.mark.parametrize("layout, args", [("varlen", ["--window", "64,0", "--softcap", "30"]),
                                          ("paged", ["--window", "64,0", "--sinks", "--page-size", "16"])])
def test_bench_serving_with_options_on_one_mix_end_to_end(monkeypatch, tmp_path, layout, args):
    """The real kernel built with the options, its gate, and FA4 given the same options, on the smallest mix."""
    from tuner.measure import mixes

    original = mixes.serving_problems
    monkeypatch.setattr(bench_serving, "serving_problems",
                        lambda *a, **kw: original(*a, names=["64 random 1-512"], **kw))
    out = tmp_path / f"{layout}.json"
    result = mixes_tests.invoke("bench", "--gpu", "h100", "--variant", "gqa", "--head-dim", "128", "--causal",
                                "--layout", layout, *args, "--json", str(out),
                                env={"TUNER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert row["status"] == "ok" and row["window"] == [64, 0] and row["ours"] > 0, row
    assert all(k["verified"] for k in record["kernels"].values())
    if row.get("fa4") is not None:
        assert row["cross_check_against"] == ("fa4" if row.get("sdpa") is None else "sdpa")
        assert row["fa4_max_abs_diff"] < 0.05
