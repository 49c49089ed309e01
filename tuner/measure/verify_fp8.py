"""The verification gate's FP8 checks (tuner/measure/verify.py runs them for a kernel of dtype fp8).

Inputs: e4m3 q, k, v with FlashAttention-3's descales, fp32 of shape (batch, KV heads): a value x stands for
``x * descale`` of its (batch, KV head). Per check, the descales spread over 1000x across the KV heads and batches
(10^-1.5 .. 10^1.5), q's and k's apart so that their product still moves each head's scores by up to 10x (a kernel
that ignores one of them changes the softmax), and every third shape draws values near e4m3's largest (448).

The reference is fp32 attention on the dequantised inputs (``x.float() * descale``). The kernel rounds P to e4m3
for the P.V GEMM (a 3-bit mantissa: up to 1/16 relative error a value), which no 16-bit reference has, so the
yardstick is the same computation with that rounding (``emulate``: the scores in fp32, P = 2^(x - max + 8) rounded
to e4m3 as the kernel does, the sums of the unrounded P, V's descale at the division): the kernel must stay within

    max|out - ref| <= 2 * max|emulated - ref| + atol (bf16 output rounding), and
    ||out - ref|| / ||ref|| <= max(1e-2, 2 * ||emulated - ref|| / ||ref||).

Twice the emulated error, as FlashAttention's own gate allows twice its low-precision torch error: the kernel's
order of summation and its exp2 (MUFU, ~2^-22 relative) move a P across an e4m3 rounding boundary now and then,
an error of the same size as the emulated one, not more. A kernel that ignores a descale is off by the factor
(up to 10x in the scores, 1000x in the output) and fails by orders of magnitude (tests/test_verify_fp8.py).
"""
from __future__ import annotations

import math

FP8_MAX = 448.0                  # e4m3fn's largest finite value
DESCALE_SPREAD = (-1.5, 1.5)     # log10 of the descales across (batch, KV head): 1000x
NEAR_MAX_EVERY = 3               # every third check shape draws values near FP8_MAX
P_MAX_OFFSET = 8                 # the kernels' P row maximum, 2^8 (translate/sm90/frame.py FP8_MAX_OFFSET; a kernel
                                 # with a rescale threshold t offsets by 8 - t and is held to this yardstick)


def descales(batch: int, heads_kv: int, gen, device):
    """q_descale, k_descale, v_descale (fp32, (batch, heads_kv)) spread over 1000x; q's times k's within 10x of 1."""
    import torch

    n = batch * heads_kv
    lo, hi = DESCALE_SPREAD
    spread = torch.linspace(lo, hi, n, device=device)[torch.randperm(n, generator=gen, device=device)] if n > 1 \
        else torch.full((1,), hi, device=device)
    tilt = torch.rand(n, generator=gen, device=device) * 2 - 1           # log10 of q_descale * k_descale
    q_d = torch.pow(10.0, spread).view(batch, heads_kv)
    k_d = torch.pow(10.0, tilt - spread).view(batch, heads_kv)
    v_d = torch.pow(10.0, torch.linspace(hi, lo, n, device=device)).view(batch, heads_kv)
    return q_d.float().contiguous(), k_d.float().contiguous(), v_d.float().contiguous()


def inputs(problem, gen, device, near_max: bool):
    """e4m3 q, k, v (FlashAttention's layouts) and their descales. ``near_max``: values up to FP8_MAX (the scores'
    scale is then carried by descales of order 1/FP8_MAX)."""
    import torch

    amp = FP8_MAX / 3.0 if near_max else 1.0

    def draw(*shape):
        x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * amp
        return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    q = draw(problem.batch, problem.seqlen_q, problem.heads_q, problem.d_qk)
    k = draw(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_qk)
    v = draw(problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_v)
    q_d, k_d, v_d = descales(problem.batch, problem.heads_kv, gen, device)
    if near_max:   # keep the dequantised scores of order one: the values carry amp^2 more
        q_d, k_d, v_d = q_d / amp, k_d / amp, v_d / amp
    return q, k, v, {"q_descale": q_d, "k_descale": k_d, "v_descale": v_d}


def dequantised(q, k, v, scales: dict):
    """fp32 q, k, v: each e4m3 value times its (batch, KV head) descale (the serving fallback's dequantisation)."""
    import torch

    from tuner.serving.fp8_calls import dequantised as one

    group = q.shape[2] // k.shape[2]
    return (one(q, scales["q_descale"], group, torch.float32), one(k, scales["k_descale"], 1, torch.float32),
            one(v, scales["v_descale"], 1, torch.float32))


def emulate(q, k, v, scales: dict, causal: bool, scale: float | None = None):
    """The FP8 kernel's arithmetic in fp32 torch: (b, sq, hq, d_v). Scores from the dequantised q and k; per row
    P = 2^(s log2e - max log2e + 8) rounded to e4m3 for the product with the e4m3 V, the sum of the unrounded P,
    V's descale applied with the division. Rows with no visible key are 0."""
    import torch

    qf, kf, _ = dequantised(q, k, v, scales)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kt = kf.repeat_interleave(group, dim=2).transpose(1, 2)                     # (b, hq, sk, d)
    v8 = v.float().repeat_interleave(group, dim=2).transpose(1, 2)              # e4m3 values, (b, hq, sk, d_v)
    vd = scales["v_descale"].repeat_interleave(group, dim=1)[:, :, None, None]   # (b, hq, 1, 1)
    s = torch.matmul(qf.transpose(1, 2), kt.transpose(-1, -2)) * scale * math.log2(math.e)
    if causal:
        diag = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > diag, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp2(s - m + P_MAX_OFFSET)
    total = p.sum(dim=-1, keepdim=True)
    p8 = p.to(torch.float8_e4m3fn).float()
    out = torch.matmul(p8, v8) * vd / torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, out, torch.zeros_like(out)).transpose(1, 2)


def reference(q, k, v, scales: dict, causal: bool, scale: float | None = None):
    """fp32 attention on the dequantised inputs (tuner.measure.verify.reference)."""
    from tuner.measure.reference import reference as fp32_reference

    return fp32_reference(*dequantised(q, k, v, scales), causal, scale=scale)


def judge(label: str, out, ref, emulated):
    """The module doc's two bounds on a written, finite bf16 output."""
    from tuner.measure.shape_check import REL_ERR_BOUND, bounded

    if not out.numel():
        return bounded(label, out, ref, 0.0, "", REL_ERR_BOUND)
    norm = float(ref.norm()) or 1.0
    rel_bound = max(REL_ERR_BOUND, 2 * float((emulated - ref).norm()) / norm)
    return bounded(label, out, ref, float((emulated - ref).abs().max()), "the e4m3-P emulation's error", rel_bound)


def check_problem(kernel, problem, gen, device: str = "cuda", index: int = 0):
    """One FP8 check shape (tuner.measure.verify.check_problem's contract): NaN-poisoned bf16 output, inputs
    unchanged, every element written and finite, then the bounds."""
    import torch

    from tuner.measure.shape_check import ShapeCheck

    label = problem.label()
    q, k, v, scales = inputs(problem, gen, device, near_max=index % NEAR_MAX_EVERY == NEAR_MAX_EVERY - 1)
    out = torch.full((problem.batch, problem.seqlen_q, problem.heads_q, problem.d_v), float("nan"),
                     dtype=torch.bfloat16, device=device)
    failed = _run_checked(label, lambda: kernel(q, k, v, out=out, **scales), (q, k, v, *scales.values()), out, device)
    if failed is not None:
        return failed
    ref = reference(q, k, v, scales, problem.causal)
    return judge(label, out, ref, emulate(q, k, v, scales, problem.causal))


UNUSED_KEY = FP8_MAX   # what packed keys and values past seqused_k hold: a kernel that reads them is far off


def check_packed(kernel, spec, mix, heads: tuple[int, int], gen, device: str = "cuda", index: int = 0,
                 paged_cache=None):
    """One packed-sequence mix (tuner/measure/verify_varlen.py's LengthMix) through ``kernel.varlen``, or a PagedMix
    through ``kernel.paged`` (``paged_cache(k, v, cu_k, unused)``: the cache and table of the packed keys), with e4m3
    inputs and descales of shape (sequences, KV heads), spread as ``descales`` spreads them: the NaN-poisoned bf16
    output must be written and finite, the inputs unchanged, and each sequence within the module doc's bounds of its
    own fp32 reference and emulation (causal bottom-right within it; keys past its ``used`` hold UNUSED_KEY). A paged
    mix's keys lie in pages of a shuffled cache (the table is not the identity), beside spare pages of e4m3 NaN no
    table row names (verify_varlen._paged_cache); its last page's rows past its keys hold UNUSED_KEY; its V^T is sized
    by the tightest max_seqlen_k, the longest sequence's keys."""
    import torch

    hq, hkv = heads
    near_max = index % NEAR_MAX_EVERY == NEAR_MAX_EVERY - 1
    amp = FP8_MAX / 3.0 if near_max else 1.0
    label = f"{spec.label()} {mix.label()} hq{hq} hkv{hkv}" + (" near-max" if near_max else "")
    cu_q, cu_k = [0], [0]
    for sq, sk in zip(mix.seqlens_q, mix.keys):
        cu_q.append(cu_q[-1] + sq)
        cu_k.append(cu_k[-1] + sk)

    def draw(*shape):
        x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * amp
        return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    q, k, v = draw(cu_q[-1], hq, spec.d_qk), draw(cu_k[-1], hkv, spec.d_qk), draw(cu_k[-1], hkv, spec.d_v)
    for b, used in enumerate(mix.used):
        k[cu_k[b] + used:cu_k[b + 1]] = UNUSED_KEY
        v[cu_k[b] + used:cu_k[b + 1]] = UNUSED_KEY
    batch = len(mix.seqlens_q)
    scales = dict(zip(("q_descale", "k_descale", "v_descale"), descales(batch, hkv, gen, device)))
    if near_max:
        scales = {name: d / amp for name, d in scales.items()}
    as_i32 = {"dtype": torch.int32, "device": device}
    cu_seqlens_q, cu_seqlens_k = torch.tensor(cu_q, **as_i32), torch.tensor(cu_k, **as_i32)
    seqused_k = torch.tensor(mix.used, **as_i32) if mix.seqused_k is not None else None
    out = torch.full((cu_q[-1], hq, spec.d_v), float("nan"), dtype=torch.bfloat16, device=device)
    if paged_cache is not None:
        k_cache, v_cache, table = paged_cache(k, v, cu_k, UNUSED_KEY)
        failed = _run_checked(label, lambda: kernel.paged(q, k_cache, v_cache, cu_seqlens_q, seqused_k, table,
                                                          max(mix.seqlens_q), out=out, max_seqlen_k=max(mix.used),
                                                          **scales),
                              (q, k_cache, v_cache, table, *scales.values()), out, device)
    else:
        failed = _run_checked(label, lambda: kernel.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max(mix.seqlens_q),
                                                           max(mix.keys), seqused_k=seqused_k, out=out, **scales),
                              (q, k, v, *scales.values()), out, device)
    if failed is not None:
        return failed
    ref, emulated = torch.zeros_like(out, dtype=torch.float32), torch.zeros_like(out, dtype=torch.float32)
    for b, used in enumerate(mix.used):
        if cu_q[b + 1] == cu_q[b] or used == 0:   # no query, or no key: the rows are 0
            continue
        qs, ks, vs = q[cu_q[b]:cu_q[b + 1]][None], k[cu_k[b]:cu_k[b] + used][None], v[cu_k[b]:cu_k[b] + used][None]
        own = {name: d[b:b + 1] for name, d in scales.items()}
        ref[cu_q[b]:cu_q[b + 1]] = reference(qs, ks, vs, own, spec.causal)[0]
        emulated[cu_q[b]:cu_q[b + 1]] = emulate(qs, ks, vs, own, spec.causal)[0]
    return judge(label, out, ref, emulated)


def _run_checked(label: str, call, inputs: tuple, out, device: str):
    """``call()`` writing into the NaN-poisoned ``out``: a failed ShapeCheck when it raised, returned another buffer,
    changed an input or a descale, or left an element NaN/Inf; None when the output is ready to be judged."""
    import torch

    from tuner.measure.shape_check import ShapeCheck

    def fail(reason):
        return ShapeCheck(label, False, math.nan, math.nan, math.nan, math.nan, reason)

    saved = [t.clone() for t in inputs]
    try:
        result = call()
        if device != "cpu":
            torch.cuda.synchronize()
    except Exception as exc:   # a faulting kernel is a failed check, not a crash of the caller
        return fail(f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if result is not None and result.data_ptr() != out.data_ptr():
        return fail("the kernel did not write into the output buffer it was given")
    if not all(torch.equal(_bits(a), _bits(b)) for a, b in zip(inputs, saved)):
        return fail("the kernel modified its inputs or descales")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        return fail(f"{int((~finite).sum())} of {out.numel()} output elements are NaN/Inf (unwritten or overflowed)")
    return None


def _bits(t):
    import torch

    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
