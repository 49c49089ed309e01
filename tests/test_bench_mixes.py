"""`tune bench --layout varlen|paged` (tuner/commands/bench_serving.py, mix_inputs.py, serving_baselines.py, paging.py): the
page-size rule, the inputs, each baseline's call, the row logic, the table and the JSON record with a CPU
stand-in kernel (no GPU); the CLI's bad input; one GPU run (marker gpu)."""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from tuner.commands import bench_serving
from tuner.measure import serving, serving_baselines
from tuner.commands import bench as bench_cmd
from tuner import build
from tuner.commands.cli import PAGE_SIZE_HELP, app
from tuner.measure.serving_inputs import make_mix_inputs
from tuner.measure.mixes import ServingProblem
from tuner.serving.buckets.serving import PAGE_SIZES
from tuner.serving.launch.paging import compatible_page_sizes, page_misfit, page_size_error


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env)


# Small mixes (CPU): equal lengths with padding; a cached prefix (more keys than queries) over pages of 16.
VARLEN = ServingProblem("varlen", "tiny", (5, 33, 1), (5, 33, 1), "gqa", 4, 2, 64, 64, True, "bf16")
PAGED = ServingProblem("paged", "tiny-prefix", (3, 20), (40, 20), "gqa", 4, 2, 64, 64, True, "bf16", 16)


def _attend(q, k, v, causal, scale):
    """One sequence, (s, h, d), fp32; causal aligned bottom-right; GQA by repeating KV heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


@dataclass
class CpuKernel:
    """AttentionKernel's varlen/paged signatures, computed on the CPU; ``offset`` makes it wrong."""

    causal: bool = True
    offset: float = 0.0
    fail: bool = False

    def _run(self, q, keys, values, cu_q, scale):
        if self.fail:
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        outs = [_attend(q[cu_q[b]:cu_q[b + 1]], kb, vb, self.causal, scale)
                for b, (kb, vb) in enumerate(zip(keys, values))]
        return (torch.cat(outs) + self.offset).to(q.dtype)

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=None, softmax_scale=None, out=None):
        n = len(cu_k) - 1
        return self._run(q, [k[cu_k[b]:cu_k[b + 1]] for b in range(n)], [v[cu_k[b]:cu_k[b + 1]] for b in range(n)],
                         cu_q, softmax_scale)

    def paged(self, q, kc, vc, cu_q, used, table, max_q, softmax_scale=None, out=None):
        keys = [kc[table[b].long()].flatten(0, 1)[:int(used[b])] for b in range(len(used))]
        values = [vc[table[b].long()].flatten(0, 1)[:int(used[b])] for b in range(len(used))]
        return self._run(q, keys, values, cu_q, softmax_scale)


class Timer:
    """MS per call (tiny, so the tiny mixes have TFLOPS to compare); records what was timed."""

    MS = 1e-6

    def __init__(self):
        self.timed = []

    def __call__(self, fn):
        self.timed.append(fn)
        fn()
        return self.MS


@pytest.fixture
def no_flashinfer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)


def row_of(kernel, problem, timer=None):
    return serving.mix_row(kernel, problem, device="cpu", clock=timer or Timer())


# -- the page-size rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("page,block_n,fits", [(16, 128, True), (128, 128, True), (256, 128, True),
                                               (64, 96, False), (32, 176, False), (16, 176, True), (0, 128, False)])
def test_a_page_must_divide_block_n_or_be_a_multiple_of_it(page, block_n, fits):
    reason = page_misfit(page, block_n)
    assert (reason is None) == fits
    if not fits:
        assert f"page size {page}" in reason and f"block N {block_n}" in reason and "must divide" in reason


def test_compatible_page_sizes_and_the_cli_help_list_the_supported_sizes():
    assert compatible_page_sizes(128) == PAGE_SIZES
    assert compatible_page_sizes(96) == (16, 32)
    assert ", ".join(map(str, PAGE_SIZES)) in PAGE_SIZE_HELP


def test_page_size_error_states_its_reason():
    assert page_size_error("paged", None) is None and page_size_error("dense", None) is None
    assert page_size_error("paged", 64) is None
    assert "--layout paged only (got --layout varlen)" in page_size_error("varlen", 16)
    assert "page size 24 is not supported" in page_size_error("paged", 24)


def test_bench_page_sizes_default_to_those_of_16_and_128_that_fit():
    assert bench_serving.resolve_page_sizes("varlen", None, 128) == (None,)
    assert bench_serving.resolve_page_sizes("paged", None, 128) == (16, 128)
    assert bench_serving.resolve_page_sizes("paged", None, 96) == (16,)
    assert bench_serving.resolve_page_sizes("paged", 64, 128) == (64,)
    with pytest.raises(ValueError, match="page size 64 does not fit block N 96"):
        bench_serving.resolve_page_sizes("paged", 64, 96)


# -- inputs -------------------------------------------------------------------------------------------


def test_paged_inputs_hold_the_packed_keys_in_shuffled_pages():
    x = make_mix_inputs(PAGED, "cpu")
    assert x.page_table.shape == (2, 3) and x.k_cache.shape == (5, 16, 2, 64)   # 40 keys: 3 pages; 20: 2
    assert sorted(x.page_table[0].tolist() + x.page_table[1, :2].tolist()) == [0, 1, 2, 3, 4]
    assert x.page_table[0].tolist() != [0, 1, 2]    # shuffled: an identity table would hide a kernel ignoring it
    for b, (start, keys) in enumerate(((0, 40), (40, 20))):
        paged = x.k_cache[x.page_table[b].long()].flatten(0, 1)[:keys]
        assert torch.equal(paged, x.k[start:start + keys])
    assert x.cu_seqlens_q.tolist() == [0, 3, 23] and x.seqused_k.tolist() == [40, 20]


# -- rows ---------------------------------------------------------------------------------------------


def test_a_varlen_row_times_ours_and_each_baseline_and_reports_their_differences(fa4_stand_in, no_flashinfer):
    row = row_of(CpuKernel(), VARLEN)
    assert row["status"] == "ok" and row["cross_check_against"] == "sdpa"
    assert row["ours"] == round(VARLEN.flops / (Timer.MS * 1e-3) / 1e12, 2) and row["ours_ms"] == round(Timer.MS, 5)
    assert row["fa4"] == row["ours"] and row["sdpa"] == row["ours"] and row["ours/fa4"] == 1.0
    assert row["fa4_max_abs_diff"] < 2e-2 and row["sdpa_max_abs_diff"] < 2e-2
    assert row["flashinfer"] is None and row["flashinfer_err"].startswith("not installed")
    assert row["sdpa_note"] == "is_causal on the padded batch"
    call = next(c for c in fa4_stand_in.CALLS if c.get("varlen"))
    assert call["causal"] and not call["paged"] and call["softmax_scale"] == pytest.approx(64 ** -0.5)
    assert (row["bucket"], row["total_q"], row["batch"]) == (VARLEN.bucket, 39, 3)


def test_sdpa_gets_a_bottom_right_mask_where_keys_outnumber_queries(fa4_stand_in, no_flashinfer):
    row = row_of(CpuKernel(), PAGED)
    assert row["status"] == "ok", row
    assert "explicit bottom-right causal mask" in row["sdpa_note"] and "top-left" in row["sdpa_note"]
    assert row["sdpa_max_abs_diff"] < 2e-2 and row["fa4_max_abs_diff"] < 2e-2    # FA4 read the shuffled pages
    assert next(c for c in fa4_stand_in.CALLS if c.get("varlen"))["paged"]
    # the mask matters: SDPA's own is_causal (top-left) gives other rows on this mix
    x = make_mix_inputs(PAGED, "cpu")
    prep = serving_baselines._sdpa(PAGED, x)
    ours = CpuKernel().paged(x.q, x.k_cache, x.v_cache, x.cu_seqlens_q, x.seqused_k, x.page_table, 20)
    assert (prep.packed(prep.call()).float() - ours.float()).abs().max() < 2e-2
    assert not serving_baselines.sdpa_mask_free(PAGED)


def test_sdpa_hides_padded_keys_without_causal(fa4_stand_in, no_flashinfer):
    problem = ServingProblem("varlen", "tiny-nc", (5, 33, 1), (5, 33, 1), "gqa", 4, 2, 64, 64, False, "bf16")
    row = row_of(CpuKernel(causal=False), problem)
    assert row["status"] == "ok"
    assert row["sdpa_note"].startswith("explicit mask hiding the padded keys, KV heads repeated")
    assert row["sdpa_max_abs_diff"] < 2e-2


def test_a_wrong_kernel_is_failed_and_not_timed(fa4_stand_in, no_flashinfer):
    timer = Timer()
    row = row_of(CpuKernel(offset=0.5), VARLEN, timer)
    assert row["status"] == "FAILED" and "differs from sdpa" in row["reason"]
    assert row["ours"] is None and len(timer.timed) == 2 * serving.TIMING_ROUNDS   # fa4 and sdpa only
    assert row["fa4_max_abs_diff"] == pytest.approx(0.5, abs=2e-2)


def test_ours_and_each_baseline_are_timed_in_rounds_with_ours_first_and_last_in_turn(fa4_stand_in, no_flashinfer):
    """A single pass gave the GPU's post-idle clocks to whichever ran first: each backend is timed
    TIMING_ROUNDS times, ours opening the even rounds and closing the odd ones."""
    timer = Timer()
    row = row_of(CpuKernel(), VARLEN, timer)
    assert row["status"] == "ok" and row["fa4"] is not None and row["sdpa"] is not None
    per_round = len(timer.timed) // serving.TIMING_ROUNDS
    assert per_round == 3 and len(timer.timed) == 3 * serving.TIMING_ROUNDS     # ours, fa4, sdpa
    rounds = [timer.timed[r * per_round:(r + 1) * per_round] for r in range(serving.TIMING_ROUNDS)]
    ours = rounds[0][0]
    assert all(len(set(map(id, r))) == per_round for r in rounds)
    assert [r.index(ours) for r in rounds] == [0 if i % 2 == 0 else per_round - 1 for i in range(len(rounds))]


def test_a_kernel_that_raises_is_an_error_row_with_the_baselines(fa4_stand_in, no_flashinfer):
    row = row_of(CpuKernel(fail=True), VARLEN)
    assert row["status"] == "error" and "LAUNCH_FAILED" in row["reason"]
    assert row["ours"] is None and row["fa4"] is not None and "fa4_max_abs_diff" not in row


def test_a_baseline_disagreeing_with_a_checked_kernel_is_not_timed(fa4_stand_in, no_flashinfer):
    fa4_stand_in.WRONG = True
    row = row_of(CpuKernel(), VARLEN)
    assert row["status"] == "ok" and row["fa4"] is None and row["ours/fa4"] is None
    assert "output differs from ours and sdpa" in row["fa4_err"]


def test_fa4_missing_is_not_installed(fa4_missing, no_flashinfer):
    row = row_of(CpuKernel(), VARLEN)
    assert row["status"] == "ok" and row["fa4"] is None and row["fa4_err"].startswith("not installed")


# -- the table and the command's record ---------------------------------------------------------------


def _render(table) -> str:
    console = Console(record=True, width=400)
    console.print(table)
    return console.export_text()


def test_the_table_shows_numbers_not_installed_and_notes(fa4_stand_in, no_flashinfer):
    rows = [row_of(CpuKernel(), VARLEN), row_of(CpuKernel(), PAGED), row_of(CpuKernel(offset=0.5), VARLEN)]
    text = _render(bench_serving.results_table(rows, "tiny"))
    lines = [line for line in text.splitlines() if "tiny" in line and "│" in line]
    assert len(lines) == 3
    assert "not installed" in lines[0] and f"{rows[0]['ours']:g}" in lines[0]
    assert "16" in lines[1] and "FAILED" in lines[2]
    assert "sdpa on 'tiny-prefix p16': explicit bottom-right causal mask" in text


def _stand_in_command(monkeypatch, tmp_path, verified=True):
    """run_mix_bench with the GPU parts replaced: no device check, a built kernel that is our CPU stand-in,
    tiny mixes instead of tuner/measure/mixes.toml's."""
    @dataclass(frozen=True)
    class Params:
        block_n: int = 128
        g2s_atom: str = "SM80_CP_ASYNC_CACHEGLOBAL"   # the paged default's copy (translate/defaults.py)

        def to_dict(self):
            return {"block_n": self.block_n, "g2s_atom": self.g2s_atom}

        def key(self):
            return "stand-in"

    @dataclass(frozen=True)
    class Built:
        spec: object
        params: object = Params()
        kernel: object = type("K", (), {"name": "standin_paged"})()
        compiled: object = type("C", (), {"registers": 1, "spill_stores": 0, "nvcc_version": "V0",
                                          "resources": lambda self: {}})()

    timer = Timer()
    monkeypatch.setattr(bench_cmd, "device_problem", lambda profile, err: None)
    monkeypatch.setattr(build, "build_kernels", lambda targets, *a, **kw: ([Built(s) for _, s in targets], 0))
    monkeypatch.setattr(bench_cmd, "environment_record", lambda profile, nvcc: {"device": "CPU stand-in"})
    monkeypatch.setattr(bench_serving, "_load_and_verify", lambda built: (
        [CpuKernel(causal=b.spec.causal) for b in built] if verified else None,
        {b.spec.label(): {"name": "standin_paged", "verified": verified, "reason": "" if verified else
                          "1 of 4 mixes failed; first: page16: rel err 0.3"} for b in built}))
    monkeypatch.setattr(bench_serving, "serving_problems", lambda layout, variant, hq, hkv, dqk, dv, causal, dtype, page:
                        [ServingProblem(layout, "tiny-prefix", (3, 20), (40, 20), variant, 4, 2, 64, 64, causal,
                                        dtype, page)])
    original = serving.mix_rows
    monkeypatch.setattr(bench_serving, "mix_rows", lambda k, ps, **kw: original(k, ps, device="cpu", clock=timer, **kw))
    return timer


def test_the_command_writes_rows_per_page_size_and_prints_the_table_last(monkeypatch, tmp_path, fa4_stand_in,
                                                                         no_flashinfer):
    _stand_in_command(monkeypatch, tmp_path)
    out = tmp_path / "paged.json"
    result = invoke("bench", "--gpu", "h100", "--model", "llama3-8b", "--layout", "paged", "--json", str(out))
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["layout"] == "paged" and record["model"] == "llama3-8b" and record["heads"] == [32, 8]
    assert record["page_sizes"] == [16, 128] and record["flashinfer"]["installed"] is False
    assert [(r["page_size"], r["status"], r["causal"]) for r in record["rows"]] == [(16, "ok", True), (128, "ok", True)]
    assert all(r["ours"] > 0 and r["fa4"] > 0 and r["sdpa"] > 0 for r in record["rows"])
    table_at = result.stdout.rindex("TFLOPS")
    assert result.stdout.rindex("tiny-prefix") > table_at and "wrote" in result.stdout[table_at:]


def test_a_failed_verification_exits_1_with_the_reason_and_times_nothing(monkeypatch, tmp_path, fa4_stand_in):
    timer = _stand_in_command(monkeypatch, tmp_path, verified=False)
    out = tmp_path / "paged.json"
    result = invoke("bench", "--gpu", "h100", "--variant", "gqa", "--causal", "--layout", "paged",
                    "--page-size", "16", "--json", str(out))
    assert result.exit_code == 1
    assert "verification FAILED: 1 of 4 mixes failed" in result.stderr and "nothing is timed" in result.stderr
    assert timer.timed == [] and not out.exists()


# -- bad input (exit 2 before any GPU work) -----------------------------------------------------------


@pytest.mark.parametrize("command", ["bench", "build"])
@pytest.mark.parametrize("args,message", [
    (("--layout", "dense", "--page-size", "16"), "--page-size applies to --layout paged only (got --layout dense)"),
    (("--layout", "varlen", "--page-size", "16"), "--page-size applies to --layout paged only (got --layout varlen)"),
    (("--layout", "paged", "--page-size", "24"),
     "--page-size: page size 24 is not supported; choose one of: 16, 32, 64, 128, 256"),
    (("--layout", "ragged"), "unknown layout 'ragged'; choose one of: dense, varlen, paged"),
    (("--layout", "paged", "--page-size", "64", "--params", '{"block_n": 96, "g2s_atom": "SM90_TMA"}'),
     "page size 64 does not fit block N 96: the page size must divide block N or be a multiple of it"),
])
def test_bad_layout_and_page_size_exit_2_with_the_reason(command, args, message, tmp_path):
    out = ("-o", str(tmp_path / "out")) if command == "build" else ()
    result = invoke(command, "--gpu", "h100", "--variant", "gqa", *args, *out)
    assert result.exit_code == 2, result.output
    assert f"tune {command}: error: {message}" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,message", [
    (("--layout", "varlen"), "give --variant (mha, gqa, mqa or mla) or --model"),
    (("--model", "llama3-8b", "--variant", "gqa", "--layout", "varlen"), "--model sets the variant and head dim"),
    (("--model", "nope", "--layout", "paged"), "unknown model 'nope'"),
    (("--variant", "gqa", "--layout", "varlen", "--seqlens", "512"), "--seqlens sets the paper grid"),
    (("--gpu", "a100", "--variant", "gqa", "--layout", "varlen"), "built by the warp-specialised Hopper schedules"),
])
def test_bench_serving_usage_errors_exit_2(args, message):
    gpu = () if "--gpu" in args else ("--gpu", "h100")
    result = invoke("bench", *gpu, *args)
    assert result.exit_code == 2 and message in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_varlen_without_gpu_exits_2_after_checking_its_input():
    result = invoke("bench", "--gpu", "h100", "--model", "llama3-8b", "--layout", "paged", "--page-size", "16")
    assert result.exit_code == 2 and "no CUDA GPU is visible" in result.stderr


# -- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a Hopper GPU (the serving layouts build warp-specialised sm90 kernels)")
def test_bench_varlen_on_one_mix_end_to_end(monkeypatch, tmp_path):
    """The real kernel, verification and baselines on the smallest mix of mixes.toml."""
    from tuner.measure import mixes

    original = mixes.serving_problems
    monkeypatch.setattr(bench_serving, "serving_problems",
                        lambda *a, **kw: original(*a, names=["64 random 1-512"], **kw))
    out = tmp_path / "varlen.json"
    result = invoke("bench", "--gpu", "h100", "--model", "llama3-8b", "--layout", "varlen", "--json", str(out),
                    env={"TUNER_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert row["mix"] == "64 random 1-512" and row["status"] == "ok", row
    assert row["ours"] > 0 and row["sdpa"] > 0 and row["sdpa_max_abs_diff"] < 0.05
    assert row["ours"] == pytest.approx(row["flops"] / (row["ours_ms"] * 1e-3) / 1e12, rel=1e-2)
    if row.get("fa4") is not None:
        assert row["fa4_max_abs_diff"] < 0.05 and row["ours/fa4"] == pytest.approx(row["ours"] / row["fa4"], rel=1e-2)
    assert all(k["verified"] for k in record["kernels"].values())
    assert math.isfinite(row["flops"]) and "TFLOPS" in result.stdout


def test_the_cp_async_producer_reads_any_multiple_of_8_and_the_tma_one_what_its_tile_divides():
    from tuner.serving.launch.paging import compatible_page_sizes, page_misfit

    assert page_misfit(48, 128) is not None and page_misfit(48, 128, "SM80_CP_ASYNC_CACHEGLOBAL") is None
    assert "multiple of 8" in page_misfit(12, 128, "SM80_CP_ASYNC_CACHEGLOBAL")
    assert compatible_page_sizes(176, "SM80_CP_ASYNC_CACHEGLOBAL") == (16, 32, 64, 128, 256)
    assert compatible_page_sizes(176) == (16,)   # 176 = 11 boxes of 16


# -- FP8: the libraries and our bf16 default on the same values in bf16 --------------------------------------------


@dataclass
class CpuFp8Kernel(CpuKernel):
    """An FP8 varlen kernel's signature (e4m3 q, k, v and the three descales, bf16 out), computed on the CPU."""

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=None, softmax_scale=None, out=None,
               q_descale=None, k_descale=None, v_descale=None):
        assert q.dtype == torch.float8_e4m3fn and q_descale is not None and v_descale is not None
        as_bf16 = [t.to(torch.bfloat16) for t in (q, k, v)]   # the bench's descales are ones
        return super().varlen(*as_bf16, cu_q, cu_k, max_q, max_k, seqused_k, softmax_scale, out)


FP8_VARLEN = ServingProblem("varlen", "tiny", (5, 33, 1), (5, 33, 1), "gqa", 4, 2, 64, 64, True, "fp8")


def test_an_fp8_row_times_our_bf16_default_in_the_same_rounds_on_the_same_values(fa4_stand_in, no_flashinfer):
    timer = Timer()
    row = serving.mix_row(CpuFp8Kernel(), FP8_VARLEN, device="cpu", clock=timer, twin=CpuKernel())
    assert row["status"] == "ok" and row["cross_check_against"] == "sdpa"
    assert row["ours_bf16"] == row["ours"] and row["ours/ours_bf16"] == 1.0
    assert len(timer.timed) == 4 * serving.TIMING_ROUNDS   # ours, the bf16 twin, fa4, sdpa in every round
    call = next(c for c in fa4_stand_in.CALLS if c.get("varlen"))
    assert call["q"][-1] == 64   # FA4 ran (on the bf16 copy of the e4m3 values)
    headers = [c.header for c in bench_serving.results_table([row], "t").columns]
    assert headers[4:7] == ["ours", "ours bf16", "ours/bf16"]


def test_a_twin_that_disagrees_with_ours_is_reported_and_not_timed(fa4_stand_in, no_flashinfer):
    timer = Timer()
    row = serving.mix_row(CpuFp8Kernel(), FP8_VARLEN, device="cpu", clock=timer, twin=CpuKernel(offset=0.5))
    assert row["status"] == "ok" and "ours_bf16" not in row
    assert "differs from ours" in row["ours_bf16_err"] and len(timer.timed) == 3 * serving.TIMING_ROUNDS
    table = bench_serving.results_table([row], "t")
    assert "ours bf16" not in [c.header for c in table.columns]


@dataclass
class CpuFp8PagedKernel(CpuKernel):
    """An FP8 paged kernel's signature (e4m3 q and caches, the three descales and max_seqlen_k, bf16 out), on the CPU."""

    def paged(self, q, kc, vc, cu_q, used, table, max_q, softmax_scale=None, out=None, q_descale=None,
              k_descale=None, v_descale=None, max_seqlen_k=None):
        assert q.dtype == kc.dtype == torch.float8_e4m3fn and q_descale is not None and v_descale is not None
        assert max_seqlen_k is not None and max_seqlen_k >= int(used.max())
        as_bf16 = [t.to(torch.bfloat16) for t in (q, kc, vc)]   # the bench's descales are ones
        return super().paged(*as_bf16, cu_q, used, table, max_q, softmax_scale, out)


FP8_PAGED = ServingProblem("paged", "tiny", (5, 33, 1), (5, 40, 17), "gqa", 4, 2, 64, 64, True, "fp8", page_size=16)


def test_an_fp8_paged_row_times_our_bf16_paged_default_on_the_same_values(fa4_stand_in, no_flashinfer):
    """The e4m3 caches with descales and the mix's longest keys for ours; the libraries and the bf16 twin read the
    same values in bf16, caches included."""
    from tuner.measure.serving_inputs import baseline_view, make_mix_inputs

    x = make_mix_inputs(FP8_PAGED, "cpu")
    assert x.k_cache.dtype == torch.float8_e4m3fn and x.descales["k_descale"].shape == (3, 2)
    _, theirs = baseline_view(FP8_PAGED, x)
    assert theirs.k_cache.dtype == torch.bfloat16 and theirs.descales is None
    assert torch.equal(theirs.v_cache.float(), x.v_cache.float())
    timer = Timer()
    row = serving.mix_row(CpuFp8PagedKernel(), FP8_PAGED, device="cpu", clock=timer, twin=CpuKernel())
    assert row["status"] == "ok" and row["ours_bf16"] == row["ours"], row
