"""Decode benchmarks: achieved HBM bandwidth (bytes of K/V read / time) of a decode kernel against FA4's paged
decode and the GPU's measured copy bandwidth, same process, same inputs.

A point is one decode call: ``batch`` sequences of ``kv_len`` cached keys each in a shuffled paged cache, one
(or a few) new query tokens. Every call (ours, FA4's, FlashInfer's, the copy) is timed by tuner.measure.timer.time_ms
with DECODE_TIMING: do_bench's procedure with L2 emptied by a read, not a memset (see Timing.l2_flush).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernel_abi.spec import options_text
from tuner.measure.timer import Timing, time_ms

BATCHES = (1, 8, 32, 64, 128)
KV_LENS = (1024, 4096, 8192, 16384, 32768)
# a decode call of 128k cache tokens takes 70-140 us on an H200, of which do_bench's dirty flush would add 8-9
DECODE_TIMING = Timing(l2_flush="read")


def keys_read(kv_len: int, seqlen_q: int, window) -> int:
    """Keys of one sequence a decode call reads: with a left window only the last left + seqlen_q (+ right) of its
    kv_len (the kernel skips the tiles before the window)."""
    left, right = window
    return kv_len if left < 0 else min(kv_len, left + seqlen_q + max(right, 0))


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    kv_len: int
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    seqlen_q: int = 1
    page_size: int = 16          # 0: a dense cache (b, kv_len, hkv, d)
    causal: bool = True
    dtype: str = "bf16"
    # the options of a kernel built with them (kernel_abi.spec), given to ours and to FA4 alike
    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    kv_dtype: str = ""           # "fp8": an e4m3 cache with per-KV-head scales (make_decode_inputs)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the call reads (a window's keys only): 2 a value, 1 in an FP8 cache."""
        element = 1 if self.kv_dtype == "fp8" else 2
        return 2 * self.batch * keys_read(self.kv_len, self.seqlen_q, self.window) * self.heads_kv * self.head_dim * \
            element

    def label(self) -> str:
        cache = f"p{self.page_size}" if self.page_size else "dense"
        return f"b{self.batch} kv{self.kv_len // 1024}k sq{self.seqlen_q} {cache}" + \
            options_text(self.window, self.softcap, self.sinks) + (f" kv{self.kv_dtype}" if self.kv_dtype else "")


def decode_options(p, device: str = "cuda") -> dict:
    """Our decode kernel's keyword arguments for a point's (or problem's) options: window_size, softcap,
    learnable_sink (tuner.measure.dense.problem_sinks: the same logits FA4 is given); none for a plain one."""
    from tuner.measure.dense import problem_sinks

    if tuple(p.window) == (-1, -1) and not p.softcap and not p.sinks:
        return {}
    return {"window_size": tuple(p.window), "softcap": p.softcap,
            "learnable_sink": problem_sinks(p, device) if p.sinks else None}


def decode_grid(batches=BATCHES, kv_lens=KV_LENS, **common) -> list[DecodePoint]:
    return [DecodePoint(b, kv, **common) for b in batches for kv in kv_lens]


def make_decode_inputs(p: DecodePoint, seed: int = 0, device: str = "cuda") -> dict:
    import torch

    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[p.dtype])
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim, device=device, dtype=dt)
    used = torch.full((p.batch,), p.kv_len, dtype=torch.int32, device=device)
    if not p.page_size:
        k = torch.randn(p.batch, p.kv_len, p.heads_kv, p.head_dim, device=device, dtype=dt)
        return _fp8_cache(p, {"q": q, "k": k, "v": torch.randn_like(k), "page_table": None, "seqused_k": used})
    pages = math.ceil(p.kv_len / p.page_size)
    table = torch.randperm(p.batch * pages, generator=gen).to(device, torch.int32).view(p.batch, pages)
    k = torch.randn(p.batch * pages, p.page_size, p.heads_kv, p.head_dim, device=device, dtype=dt)
    v = torch.randn_like(k)
    return _fp8_cache(p, {"q": q, "k": k, "v": v, "page_table": table, "seqused_k": used})


def _fp8_cache(p: DecodePoint, x: dict) -> dict:
    """An FP8 point's inputs: the cache quantised with per-KV-head scales (unit-normal values, 4 sigma at 448), the
    scales in ``x["kv_scales"]`` (the kernel's k_scale, v_scale); a 16-bit point's as they are."""
    if p.kv_dtype != "fp8":
        return x
    import torch

    from tuner.serving.kvcache_fp8 import quantise

    scale = torch.full((p.heads_kv,), 4.0 / 448, device=x["q"].device)
    x["k"], x["v"] = quantise(x["k"], scale), quantise(x["v"], scale)
    x["kv_scales"] = (scale, scale.clone())
    return x


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """A device-to-device copy of ``nbytes``: bytes read + written per second, the bound decode aims at."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), timing=DECODE_TIMING)
    return 2 * nbytes / ms / 1e6


def fa4_decode_call(p: DecodePoint, x: dict):
    from tuner.measure import fa4

    func = fa4.varlen_func()
    options = {}
    given = decode_options(p, x["q"].device)
    if given.get("window_size", (-1, -1)) != (-1, -1):     # FA4: None leaves a side open
        options["window_size"] = tuple(None if w < 0 else w for w in given["window_size"])
    if given.get("softcap"):
        options["softcap"] = given["softcap"]
    if given.get("learnable_sink") is not None:
        options["learnable_sink"] = given["learnable_sink"]

    def call():
        out = func(x["q"], x["k"], x["v"], seqused_k=x["seqused_k"], page_table=x["page_table"], causal=p.causal,
                   softmax_scale=1.0 / math.sqrt(p.head_dim), **options)
        return out[0] if isinstance(out, (tuple, list)) else out

    return call


def measure_point(kernel, p: DecodePoint, with_fa4: bool = True, fa4_first: bool = False) -> dict:
    """{point, ours_gbs, fa4_gbs (or fa4_error), max_diff_vs_fa4}; ``fa4_first`` times FA4 before ours (re-timing
    alternates the order so that neither always runs on a warmer GPU)."""
    import torch

    x = make_decode_inputs(p)
    options = decode_options(p)
    ours = lambda: kernel(x["q"], x["k"], x["v"], cache_seqlens=x["seqused_k"], page_table=x["page_table"],  # noqa: E731
                          **options)
    row = {"point": p.label(), "batch": p.batch, "kv_len": p.kv_len, "seqlen_q": p.seqlen_q}
    o = ours()
    capacity = x["page_table"].shape[1] * p.page_size if p.page_size else p.kv_len
    from kernel_abi.spec import effective_window

    window = effective_window(tuple(options.get("window_size", (-1, -1))), p.causal)
    row["splits"] = kernel.split_plan(p.batch, p.heads_q, p.heads_kv, p.seqlen_q,
                                      kernel.visible_keys(capacity, p.seqlen_q, window))[0].num_splits
    if not fa4_first:
        row["ours_gbs"] = p.kv_bytes / time_ms(ours, timing=DECODE_TIMING) / 1e6
    if with_fa4:
        try:
            fa = fa4_decode_call(p, x)
            ref = fa()
            row["fa4_gbs"] = p.kv_bytes / time_ms(fa, timing=DECODE_TIMING) / 1e6
            row["max_diff_vs_fa4"] = float((o.float() - ref.float()).abs().max())
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is recorded, not fatal
            row["fa4_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    if fa4_first:
        row["ours_gbs"] = p.kv_bytes / time_ms(ours, timing=DECODE_TIMING) / 1e6
    del x
    torch.cuda.empty_cache()
    return row


# Ours against FlashInfer on the same e4m3 cache: both read the same values (e4m3 x scale is exact in fp32), so they
# differ by the 16-bit arithmetic of P and the output only; a larger difference is a wrong call, not timed.
FLASHINFER_CROSS_CHECK_REL_ERR = 2e-2


class FlashInferUnavailable(RuntimeError):
    """FlashInfer cannot run this point here (not installed, or a case its FP8 decode call is not given)."""


def flashinfer_fp8_decode_call(p: DecodePoint, x: dict):
    """FlashInfer's batch decode over the point's own e4m3 paged cache (BatchDecodeWithPagedKVCacheWrapper, NHD pages,
    planned here untimed with kv_data_type float8_e4m3fn, a per-tensor k_scale/v_scale): the FP8-KV decode a vLLM user
    would pick instead. -> ``() -> out (batch, heads_q, d)``. FlashInferUnavailable naming why for what it is not
    given here: no flashinfer, a dense cache, several new tokens, options, per-KV-head scales that differ."""
    import torch

    if not p.page_size or p.seqlen_q != 1 or decode_options(p, x["q"].device):
        raise FlashInferUnavailable("FlashInfer's FP8 decode is timed on paged caches, one new token, no options")
    k_scale, v_scale = x["kv_scales"]
    if bool((k_scale != k_scale.reshape(-1)[0]).any()) or bool((v_scale != v_scale.reshape(-1)[0]).any()):
        raise FlashInferUnavailable("FlashInfer takes one k_scale and v_scale per call; the point's differ per KV head")
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - an absent or broken install is a reason, not a crash
        raise FlashInferUnavailable(f"not installed: flashinfer is not importable ({type(exc).__name__})") from None
    from tuner.measure.serving_baselines import FLASHINFER_WORKSPACE_BYTES
    device = x["q"].device
    table = x["page_table"]
    pages = int(table.shape[1])
    indptr = torch.arange(p.batch + 1, dtype=torch.int32, device=device) * pages
    last = torch.full((p.batch,), p.kv_len - (pages - 1) * p.page_size, dtype=torch.int32, device=device)
    workspace = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                            use_tensor_cores=p.heads_q // p.heads_kv >= 4)
    wrapper.plan(indptr, table.reshape(-1).contiguous(), last, p.heads_q, p.heads_kv, p.head_dim, p.page_size,
                 q_data_type=x["q"].dtype, kv_data_type=x["k"].dtype, sm_scale=1.0 / math.sqrt(p.head_dim))
    q = x["q"][:, 0].contiguous()
    ks, vs = float(k_scale.reshape(-1)[0]), float(v_scale.reshape(-1)[0])
    return lambda: wrapper.run(q, (x["k"], x["v"]), k_scale=ks, v_scale=vs)


def measure_fp8_point(fp8_kernel, kernel, p: DecodePoint, with_flashinfer: bool = True) -> dict:
    """An FP8 cache point (p.kv_dtype fp8) against the 16-bit cache's kernel on the same point and FlashInfer's FP8
    decode on the same e4m3 cache (where it runs: flashinfer_fp8_decode_call), all timed here in this order and again
    in the reverse (the faster of each kept, so that none always runs on a warmer GPU): {point, splits, fp8_us,
    fp8_gbs (GB/s of the e4m3 bytes read), base_us and base_gbs (the 16-bit cache's), fp8_tokens_s and base_tokens_s
    (new tokens a second: batch x seqlen_q / time), speedup (16-bit time / FP8 time), flashinfer_us, flashinfer_gbs
    and vs_flashinfer (its time / ours) or flashinfer_error}."""
    import dataclasses

    import torch

    p16 = dataclasses.replace(p, kv_dtype="")
    x8, x16 = make_decode_inputs(p), make_decode_inputs(p16)
    options = decode_options(p)
    k_scale, v_scale = x8["kv_scales"]
    fp8 = lambda: fp8_kernel(x8["q"], x8["k"], x8["v"], cache_seqlens=x8["seqused_k"],  # noqa: E731
                             page_table=x8["page_table"], k_scale=k_scale, v_scale=v_scale, **options)
    b16 = lambda: kernel(x16["q"], x16["k"], x16["v"], cache_seqlens=x16["seqused_k"],  # noqa: E731
                         page_table=x16["page_table"], **options)
    calls = {"fp8": fp8, "base": b16}
    out8 = fp8()
    b16()
    row = {}
    if with_flashinfer:
        try:
            fi = flashinfer_fp8_decode_call(p, x8)
            theirs = fi()
            torch.cuda.synchronize()
            ours = out8[:, 0].float()
            rel = float((ours - theirs.float()).norm() / ours.norm().clamp_min(1e-30))
            if not rel <= FLASHINFER_CROSS_CHECK_REL_ERR:
                raise FlashInferUnavailable(f"its output differs from ours (rel err {rel:.3g}); not timed")
            row["flashinfer_rel_diff"] = rel
            calls["flashinfer"] = fi
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run is recorded, not fatal
            row["flashinfer_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    ms = {name: math.inf for name in calls}
    names = list(calls)
    for order in (names, names[::-1]):
        for name in order:
            ms[name] = min(ms[name], time_ms(calls[name], timing=DECODE_TIMING))
    ms8, ms16 = ms["fp8"], ms["base"]
    capacity = x8["page_table"].shape[1] * p.page_size if p.page_size else p.kv_len
    tokens = p.batch * p.seqlen_q
    row = {"point": p.label(), "batch": p.batch, "kv_len": p.kv_len, "seqlen_q": p.seqlen_q,
           "splits": fp8_kernel.split_plan(p.batch, p.heads_q, p.heads_kv, p.seqlen_q, capacity)[0].num_splits,
           "fp8_us": ms8 * 1e3, "fp8_gbs": p.kv_bytes / ms8 / 1e6, "base_us": ms16 * 1e3,
           "base_gbs": p16.kv_bytes / ms16 / 1e6, "fp8_tokens_s": tokens / ms8 * 1e3,
           "base_tokens_s": tokens / ms16 * 1e3, "speedup": ms16 / ms8, **row}
    if "flashinfer" in ms:
        row.update(flashinfer_us=ms["flashinfer"] * 1e3, flashinfer_gbs=p.kv_bytes / ms["flashinfer"] / 1e6,
                   vs_flashinfer=ms["flashinfer"] / ms8)
    del x8, x16
    torch.cuda.empty_cache()
    return row


# ---- MLA absorbed decode (DeepSeek-V3): one latent KV head of 576 columns, V its first 512 ----------------------
MLA_D_QK, MLA_D_V = 576, 512


@dataclass(frozen=True)
class MLAPoint:
    """One MLA decode call: ``batch`` sequences of ``kv_len`` latent rows in a shuffled paged cache (``page_size``
    0: dense), ``seqlen_q`` new tokens (causal, bottom-right) of ``heads_q`` heads. No FA4 baseline: FA4 has no
    absorbed-MLA path (FlashMLA has; it is not a dependency), so the yardsticks are the copy bandwidth and FLOPs."""

    batch: int
    kv_len: int
    heads_q: int = 128
    seqlen_q: int = 1
    page_size: int = 64
    causal: bool = True
    dtype: str = "bf16"
    kv_dtype: str = ""    # "fp8": an e4m3 latent cache with one scale (make_mla_inputs)

    @property
    def kv_bytes(self) -> int:
        """The latent cache read once: V is part of the same rows."""
        return self.batch * self.kv_len * MLA_D_QK * (1 if self.kv_dtype == "fp8" else 2)

    @property
    def flops(self) -> float:
        """2 x rows x keys seen x (576 + 512); causal: token t of seqlen_q sees kv_len - seqlen_q + 1 + t keys."""
        sq, kv = self.seqlen_q, self.kv_len
        keys = sum(max(0, kv - sq + 1 + t) for t in range(sq)) if self.causal else sq * kv
        return 2.0 * self.batch * self.heads_q * keys * (MLA_D_QK + MLA_D_V)

    def label(self) -> str:
        cache = f"p{self.page_size}" if self.page_size else "dense"
        return f"mla h{self.heads_q} b{self.batch} kv{self.kv_len // 1024}k sq{self.seqlen_q} {cache}" + \
            (f" kv{self.kv_dtype}" if self.kv_dtype else "")


def parse_mla_points(text: str) -> list[MLAPoint]:
    """'64x4096,64x8192x2' (comma-separated batch x keys [x new tokens]) -> MLAPoints at 128 heads: the scripts'
    --points. ValueError naming the item that is not one."""
    points = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"{item!r} is not BATCHxKEYS or BATCHxKEYSxTOKENS (positive integers)")
        points.append(MLAPoint(int(parts[0]), int(parts[1]), seqlen_q=int(parts[2]) if len(parts) == 3 else 1))
    return points


def mla_grid(heads=(128, 16), batches=(64, 128), kv_lens=(4096, 8192, 16384), seqlens_q=(1, 2, 4),
             **common) -> list[MLAPoint]:
    return [MLAPoint(b, kv, heads_q=h, seqlen_q=sq, **common) for h in heads for sq in seqlens_q for b in batches
            for kv in kv_lens]


def make_mla_inputs(p: MLAPoint, seed: int = 0, device: str = "cuda") -> dict:
    import torch

    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[p.dtype])
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(p.batch, p.seqlen_q, p.heads_q, MLA_D_QK, device=device, dtype=dt)
    used = torch.full((p.batch,), p.kv_len, dtype=torch.int32, device=device)
    if not p.page_size:
        return _fp8_latent(p, {"q": q, "k": torch.randn(p.batch, p.kv_len, 1, MLA_D_QK, device=device, dtype=dt),
                               "page_table": None, "seqused_k": used})
    pages = math.ceil(p.kv_len / p.page_size)
    table = torch.randperm(p.batch * pages, generator=gen).to(device, torch.int32).view(p.batch, pages)
    k = torch.randn(p.batch * pages, p.page_size, 1, MLA_D_QK, device=device, dtype=dt)
    return _fp8_latent(p, {"q": q, "k": k, "page_table": table, "seqused_k": used})


def _fp8_latent(p: MLAPoint, x: dict) -> dict:
    """An FP8 MLA point's inputs: the latent quantised with one scale (unit-normal values, 4 sigma at 448), given as
    ``x["kv_scales"]`` = (scale, scale), the same tensor: V is the latent rows, read at k_scale (the launcher takes
    v_scale None or k_scale itself); a 16-bit point's as they are."""
    if p.kv_dtype != "fp8":
        return x
    import torch

    from tuner.serving.kvcache_fp8 import quantise

    scale = torch.full((1,), 4.0 / 448, device=x["q"].device)
    x["k"] = quantise(x["k"], scale)
    x["kv_scales"] = (scale, scale)
    return x


def measure_mla_point(kernel, p: MLAPoint) -> dict:
    """{point, splits, ms, ours_gbs (latent cache bytes / time), ours_tflops}."""
    import torch

    x = make_mla_inputs(p)
    ours = lambda: kernel(x["q"], x["k"], None, cache_seqlens=x["seqused_k"], page_table=x["page_table"])  # noqa: E731
    ours()
    capacity = x["page_table"].shape[1] * p.page_size if p.page_size else p.kv_len
    row = {"point": p.label(), "heads_q": p.heads_q, "batch": p.batch, "kv_len": p.kv_len, "seqlen_q": p.seqlen_q,
           "splits": kernel.split_plan(p.batch, p.heads_q, 1, p.seqlen_q, capacity)[0].num_splits}
    ms = time_ms(ours, timing=DECODE_TIMING)
    row.update(ms=ms, ours_gbs=p.kv_bytes / ms / 1e6, ours_tflops=p.flops / ms / 1e9)
    del x
    torch.cuda.empty_cache()
    return row

def measure_fp8_mla_point(fp8_kernel, kernel, p: MLAPoint) -> dict:
    """An FP8 latent-cache MLA point (p.kv_dtype fp8) against the 16-bit latent cache's kernel on the same point,
    both timed here in this order and again in the reverse (the faster of each kept): {point, splits, fp8_us,
    fp8_gbs (GB/s of the e4m3 latent read), base_us, base_gbs, fp8_tokens_s, base_tokens_s, speedup (16-bit time /
    FP8 time), fp8_tflops, base_tflops, rel_diff (the two outputs' relative difference)}. The 16-bit kernel reads the
    e4m3 latent dequantised into its dtype (each value e4m3 x scale, rounded once), with the same queries and table,
    so the two outputs differ by that rounding and the kernels' own only."""
    import dataclasses

    import torch

    from tuner.serving.kvcache_fp8 import dequantise

    p16 = dataclasses.replace(p, kv_dtype="")
    x8 = make_mla_inputs(p)
    k_scale = x8["kv_scales"][0]
    x16 = {**x8, "k": dequantise(x8["k"], k_scale, x8["q"].dtype)}
    fp8 = lambda: fp8_kernel(x8["q"], x8["k"], None, cache_seqlens=x8["seqused_k"],  # noqa: E731
                             page_table=x8["page_table"], k_scale=k_scale)
    b16 = lambda: kernel(x16["q"], x16["k"], None, cache_seqlens=x16["seqused_k"],  # noqa: E731
                         page_table=x16["page_table"])
    out8, out16 = fp8().float(), b16().float()
    rel = float((out8 - out16).norm() / out16.norm().clamp_min(1e-30))
    calls = {"fp8": fp8, "base": b16}
    ms = {name: math.inf for name in calls}
    for order in (list(calls), list(calls)[::-1]):
        for name in order:
            ms[name] = min(ms[name], time_ms(calls[name], timing=DECODE_TIMING))
    ms8, ms16 = ms["fp8"], ms["base"]
    capacity = x8["page_table"].shape[1] * p.page_size if p.page_size else p.kv_len
    tokens = p.batch * p.seqlen_q
    row = {"point": p.label(), "heads_q": p.heads_q, "batch": p.batch, "kv_len": p.kv_len, "seqlen_q": p.seqlen_q,
           "splits": fp8_kernel.split_plan(p.batch, p.heads_q, 1, p.seqlen_q, capacity)[0].num_splits,
           "fp8_us": ms8 * 1e3, "fp8_gbs": p.kv_bytes / ms8 / 1e6, "base_us": ms16 * 1e3,
           "base_gbs": p16.kv_bytes / ms16 / 1e6, "fp8_tokens_s": tokens / ms8 * 1e3,
           "base_tokens_s": tokens / ms16 * 1e3, "speedup": ms16 / ms8, "fp8_tflops": p.flops / ms8 / 1e9,
           "base_tflops": p.flops / ms16 / 1e9, "rel_diff": rel}
    del x8, x16
    torch.cuda.empty_cache()
    return row

# -- a campaign trial's pieces (tuner/measure/trial.py): one decode call per decode bucket (DecodeProblem) ---------

# The baselines of a decode trial: FA4's paged decode (flash_attn_varlen_func with a page table, as `tune bench
# --phase decode`) and ``copy_bound``, the TFLOPS of a kernel reading the call's cache at the GPU's measured copy
# bandwidth.
BASELINES = ("fa4", "copy_bound")


def problem_inputs(problem, device: str) -> dict:
    """q, k, v (None for MLA: V is K's first d_v columns), page_table (None: dense) and seqused_k of a call."""
    seed = problem.batch * 7919 + problem.kv_len
    if problem.variant == "mla":
        return {**make_mla_inputs(problem.point(), seed=seed, device=device), "v": None}
    return make_decode_inputs(problem.point(), seed=seed, device=device)


def ours_call(kernel, problem, x: dict):
    scale = problem.softmax_scale
    options = decode_options(problem, x["q"].device)
    if "kv_scales" in x:   # an FP8 cache
        options["k_scale"], options["v_scale"] = x["kv_scales"]
    return lambda: kernel(x["q"], x["k"], x["v"], cache_seqlens=x["seqused_k"], page_table=x["page_table"],
                          softmax_scale=scale, **options)


def problem_tflops(problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def _sequence_kv(x: dict, problem, i: int, name: str):
    """Sequence i's keys (or values), (kv_len, hkv, d), gathered back from the cache; MLA's values are the first
    d_v columns of its keys."""
    if name == "v" and x.get("v") is None:
        return _sequence_kv(x, problem, i, "k")[..., : problem.d_v]
    cache = x[name]
    if x["page_table"] is None:
        rows = cache[i, : problem.kv_len]
    else:
        pages = x["page_table"][i]
        rows = cache[pages.long()].reshape(-1, *cache.shape[2:])[: problem.kv_len]
    if "kv_scales" in x:   # an FP8 cache: its real values
        from tuner.serving.kvcache_fp8 import dequantise

        rows = dequantise(rows, x["kv_scales"][0 if name == "k" else 1])
    return rows


def cross_check(out, x: dict, problem) -> float:
    """Largest relative error of ``out`` on the first and last sequence against the fp32 reference (the query
    heads of a KV group share its keys: no copies of K per head, which for MLA's 128 heads would be gigabytes), with
    the problem's options (tuner/serving/options.py's masking, cap and sink join)."""
    from tuner.serving.options import capped, softmax_rows, visible

    worst = 0.0
    hkv, sq = problem.heads_kv, problem.seqlen_q
    group = problem.heads_q // hkv
    sinks = decode_options(problem, x["q"].device).get("learnable_sink")
    # (hq,) -> (hkv, group * sq, 1), in the rows' order below
    sink = None if sinks is None else sinks.view(hkv, group, 1).expand(hkv, group, sq).reshape(hkv, group * sq, 1)
    for i in sorted({0, problem.batch - 1}):
        k = _sequence_kv(x, problem, i, "k").float().transpose(0, 1)     # (hkv, kv, d_qk)
        v = _sequence_kv(x, problem, i, "v").float().transpose(0, 1)     # (hkv, kv, d_v)
        # (sq, hq, d) -> (hkv, group * sq, d): row g * sq + t is token t of the group's head g
        q = x["q"][i].float().reshape(sq, hkv, group, -1).permute(1, 2, 0, 3).reshape(hkv, group * sq, -1)
        s = capped((q @ k.transpose(1, 2)) * problem.softmax_scale, getattr(problem, "softcap", 0.0))
        keep = visible(sq, problem.kv_len, problem.causal, getattr(problem, "window", (-1, -1)), q.device)
        if keep is not None:
            s = s.masked_fill(~keep.repeat(group, 1), float("-inf"))
        p, _ = softmax_rows(s, sink)
        ref = (p @ v).reshape(hkv, group, sq, -1).permute(2, 0, 1, 3).reshape(sq, hkv * group, -1)
        err = (out[i].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
        worst = max(worst, float(err))
    return worst


_COPY_GBS: dict = {}


def copy_gbs(device: str) -> float:
    """The GPU's device-to-device copy bandwidth (tuner.measure.decode), measured once per process."""
    if device not in _COPY_GBS:
        _COPY_GBS[device] = copy_bandwidth_gbs()
    return _COPY_GBS[device]


def measure_baselines(problem, timing, device: str, errors: dict) -> dict:
    """{fa4: TFLOPS or None, copy_bound: TFLOPS at the copy bandwidth}; ``errors`` gets each None's reason."""
    row: dict = {}
    try:
        row["copy_bound"] = round(problem.flops / (problem.kv_bytes / (copy_gbs(device) * 1e9)) / 1e12, 3)
    except Exception as exc:  # noqa: BLE001
        row["copy_bound"], errors["copy_bound"] = None, f"{type(exc).__name__}: {str(exc)[:200]}"
    if problem.variant == "mla":
        row["fa4"], errors["fa4"] = None, "FA4 has no absorbed-MLA decode (head dim 576/512)"
        return row
    if getattr(problem, "kv_dtype", ""):
        row["fa4"], errors["fa4"] = None, f"FA4's decode reads no {problem.kv_dtype} KV cache"
        return row
    x = problem_inputs(problem, device)
    try:
        call = fa4_decode_call(problem.point(), x)
        call()   # FA4 compiles a shape on its first call: not timed
        row["fa4"] = round(problem_tflops(problem, time_ms(call, timing=timing)), 3)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot run has a reason, not a number
        row["fa4"], errors["fa4"] = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return row
