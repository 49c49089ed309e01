"""Decode over a KV cache through an export: ``flash_attn_with_kvcache``, mixed into ExportedAttention.

    o = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table, causal=True)
    o, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, return_softmax_lse=True)
    # q (b, seqlen_q <= 16, hq, d); k/v_cache paged (num_pages, page_size, hkv, d) with an int32 table
    # (b, max_pages) (block_table=, FA2's name, or page_table=, FA3/FA4's), or dense (b, seqlen_cache, hkv, d);
    # cache_seqlens (b,) int32 (or an int) -> (b, seqlen_q, hq, d_v) [, lse (b, hq, seqlen_q) fp32, natural log]

flash-attn's conventions: sequence b's keys are the first ``cache_seqlens[b]`` rows of its cache (None: all of a
dense cache, the table's capacity for a paged one); causal aligns bottom-right (the new queries are the last
``seqlen_q`` of those keys). ``k``/``v`` append new rows at ``cache_seqlens`` first (in place, through the table),
rotated by ``rotary_cos``/``rotary_sin`` where given, as FA2 does (tuner/serving/kvcache_append.py). What the decode
kernels do not compute is refused, naming the argument: ``cache_batch_idx``, ALiBi.

``cache_leftpad`` (b,) int32 on q's device (FA2's; a dense cache only: with a table it is a ValueError, as in FA2):
sequence b's keys are rows [cache_leftpad[b], cache_seqlens[b]) of its cache (transformers' left-padded batches keep
their pads in the first rows), so it has cache_seqlens[b] - cache_leftpad[b] keys, and causal and a window align
bottom-right to them (the new queries are its last seqlen_q keys). Appended rows still land at ``cache_seqlens[b]``
(a row of the cache, counted from row 0) and are rotated at that row, as in FA2. Its values are not read back: a
leftpad at or past the length leaves a sequence no key (output 0, lse -inf). The dense decode kernels read it in
place; the absorbed-MLA kernels do not (the call runs the reference, counted ``inputs-refused``).

Model options (tuner/serving/options.py, FlashAttention's and FA4's names): ``window_size=(left, right)`` (-1 open;
causal closes the right side at 0), aligned to each sequence's ``cache_seqlens`` (query i of sequence b sees key j
when i + off - left <= j <= i + off + right, off = cache_seqlens[b] - seqlen_q), ``softcap=`` and, keyword-only,
``learnable_sink=`` ((hq,) fp32 or q's dtype: one logit per query head that joins each row's max and denominator;
the returned lse includes it). Bad values are a one-line ValueError naming the argument before anything is
appended or launched. Such a call is served by the decode config whose kernels are built with exactly the options
it needs (``ExportedConfig.features``), through ``torch.ops.attn_tuner.decode_kvcache_options`` (the options are op
arguments, not part of the route: a model's layers share their kernels; its backward differentiates the reference,
the sinks included); without one, the reference with the options, counted ``no-option-config`` (the export has
plain decode kernels of the shape) or as a plain call would be.

Dispatch, from shapes, dtypes and the device alone (decided while tracing when they are plain ints; per call
otherwise): the decode config of the cache layout (paged when a table is given), head dims, dtype and causality
(with one query token causal and non-causal agree: a config of the other causality serves it), then its bucket
by tuner/serving/decode_rule.py from the batch ``q.shape[0]``, the KV capacity (``page_table.shape[1] x
page_size``, dense ``k_cache.shape[1]``) and the page size ``k_cache.shape[1]``. The exported decode kernel
(tuner/serving/launch/decode_kernel.py) runs through ``torch.ops.attn_tuner.decode_kvcache``; else the masked torch reference
(tuner/serving/decode_sdpa.py: the pages gathered on the device, no host read) through the same op, counted by
reason: ``no-decode-config``, ``decode-page-size``, ``decode-seqlen-q`` (more than 16 query tokens), ``dtype``,
``no-shape-config``, ``no-variant``, ``inputs-refused``, ``kernel-unloadable``.

**FP8 caches** (vLLM's ``kv_cache_dtype="fp8"``): k_cache and v_cache ``torch.float8_e4m3fn`` with keyword-only
``k_scale=``/``v_scale=``, fp32 of one element (per tensor, 0-d or (1,)) or (kv_heads,) (per KV head) on the cache's
device; the real K is ``k_cache * k_scale``, the real V ``v_cache * v_scale``. q (and the output) are fp16 or bf16.
A missing scale, another shape, dtype or device, a non-contiguous one or one that is not finite (a host read, eager
calls only) is a one-line ValueError naming it, before anything is appended or launched; scales with a 16-bit cache
are refused too. FA3's ``k_descale``/``v_descale`` ((batch, kv_heads): a scale per sequence) are not taken: a cache's
scales are the cache's, not the batch's. ``k=``/``v=`` come in q's dtype and are quantised into the cache
(tuner/serving/kvcache_fp8.py: x / scale clamped to +-448). The call routes, under the dtype ``<q dtype>/kvfp8``, to
a decode config of ``"kv_dtype": "fp8"`` (its kernels read the e4m3 bytes: attn_decode_fp8.cuh) through
``torch.ops.attn_tuner.decode_kvcache_fp8`` (tuner/serving/op_decode_fp8.py), or to the reference on the cache's
rows dequantised in fp32, counted by reason as every fallback (a 16-bit cache's config never serves it, nor the
reverse). It takes no gradient (inference; the op's backward says so). Absorbed MLA over an e4m3 latent cache
(``v_cache=None``, one latent KV head of 576 columns): V is the latent rows' first 512 columns, so its scale is
``k_scale`` (pass ``v_scale=None`` or k_scale itself; another tensor is refused by name); it routes to an MLA config
of kv_dtype fp8 (attn_decode_fp8_mla.cuh) the same way, appended rows quantised with k_scale.

Autograd: as for the paged op, the backward recomputes with the reference from the saved inputs (also the
lse's gradient); q, k_cache and v_cache get gradients. ``out=`` is filled in place (through the op, from its
output: one copy).
"""
from __future__ import annotations

import math

import torch

from tuner.serving import op
from tuner.serving.configs import dispatch_dtype, pick
from tuner.serving.decode_sdpa import decode_reference
from tuner.serving.kvcache_append import append, append_errors
from tuner.serving.kvcache_fp8 import E4M3
from tuner.serving.launch.plan import check_kv_scales
from tuner.serving.op_decode_fp8 import launch_decode_fp8
from tuner.serving.op_options import launch_decode_options
from tuner.serving.options import PLAIN, ModelOptions, model_options, option_arguments
from tuner.serving.reasons import REASONS
from tuner.serving.rule import host_reads_allowed, plain_ints

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
MAX_SEQLEN_Q = 16          # translate/decode/params.py: a decode tile holds at most 16 query tokens
_MAX_MEMO = 512


def decode_input_errors(q, k_cache, v_cache, cache_seqlens, page_table) -> list[str]:
    """Every reason these cannot be a decode call (empty: they can). Shapes and dtypes only."""
    shape = lambda t: tuple(getattr(t, "shape", ()))  # noqa: E731
    if not all(isinstance(t, torch.Tensor) for t in (q, k_cache, v_cache)):
        return ["q, k_cache and v_cache must be tensors"]
    errors = []
    if q.dim() != 4:
        errors.append(f"q must be 4-D (batch, seqlen_q, heads, head_dim), got {shape(q)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4:
        errors.append(f"k_cache and v_cache must be 4-D: paged (num_pages, page_size, kv_heads, head_dim) or dense "
                      f"(batch, seqlen_cache, kv_heads, head_dim); got {shape(k_cache)} and {shape(v_cache)}")
    elif k_cache.shape[:3] != v_cache.shape[:3]:
        errors.append(f"k_cache {shape(k_cache)} and v_cache {shape(v_cache)} differ in pages/batch, rows or heads")
    if errors:
        return errors
    b = q.shape[0]
    if q.shape[1] < 1:
        errors.append("q has no query token (seqlen_q 0)")
    if q.shape[3] != k_cache.shape[3]:
        errors.append(f"q and k_cache head dims differ: {q.shape[3]} vs {k_cache.shape[3]}")
    if k_cache.shape[2] < 1 or q.shape[2] % k_cache.shape[2]:
        errors.append(f"query heads ({q.shape[2]}) must be a multiple of the KV heads ({k_cache.shape[2]})")
    if k_cache.shape[1] < 1:
        errors.append("the cache has no rows (k_cache.shape[1] is 0)")
    if page_table is not None:
        if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or page_table.dtype != torch.int32:
            errors.append(f"the page table must be a 2-D int32 tensor (batch, max_pages), got "
                          f"{getattr(page_table, 'dtype', type(page_table).__name__)} {shape(page_table)}")
        elif page_table.shape[0] != b:
            errors.append(f"the page table has {page_table.shape[0]} rows for a batch of {b}")
    elif k_cache.shape[0] != b:
        errors.append(f"a dense cache holds one sequence per batch entry: {k_cache.shape[0]} caches for a batch of "
                      f"{b} (a paged cache needs block_table= or page_table=)")
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.shape != (b,) or cache_seqlens.dtype.is_floating_point or cache_seqlens.dtype == torch.bool:
            errors.append(f"cache_seqlens must hold one integer length per sequence ({b}), got "
                          f"{cache_seqlens.dtype} {shape(cache_seqlens)}")
    elif cache_seqlens is not None and (isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int)):
        errors.append(f"cache_seqlens must be a tensor of lengths, an int or None, got {type(cache_seqlens).__name__}")
    return errors


def leftpad_errors(q, cache_leftpad, page_table) -> list[str]:
    """Why ``cache_leftpad`` cannot go with this call (empty: it can): FA2's rule, a dense cache only, and one int32
    row per sequence on q's device. Its values are not checked (a host read)."""
    if page_table is not None:
        return ["cache_leftpad does not go with a paged cache (block_table/page_table), as in FlashAttention 2"]
    if not isinstance(cache_leftpad, torch.Tensor) or cache_leftpad.dtype != torch.int32 \
            or tuple(cache_leftpad.shape) != (q.shape[0],) or cache_leftpad.device != q.device:
        return [f"cache_leftpad must be an int32 tensor of {q.shape[0]} rows (one per sequence) on {q.device}, got "
                f"{getattr(cache_leftpad, 'dtype', type(cache_leftpad).__name__)} "
                f"{tuple(getattr(cache_leftpad, 'shape', ()))} on {getattr(cache_leftpad, 'device', None)}"]
    return []


def absorbed_mla_values(q, k_cache):
    """``v_cache=None``: absorbed MLA's values, the first 512 columns of the 576-wide latent rows (FlashMLA's
    layout), as a view of ``k_cache``; any other call needs its ``v_cache``."""
    from kernel_abi.decode import MLA_DECODE_D_QK, MLA_DECODE_D_V

    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4 and k_cache.shape[3] == MLA_DECODE_D_QK \
            and k_cache.shape[2] == 1 and isinstance(q, torch.Tensor) and q.shape[-1] == MLA_DECODE_D_QK:
        return k_cache[..., :MLA_DECODE_D_V]
    raise ValueError(f"flash_attn_with_kvcache: v_cache is required; None means absorbed MLA's values (one latent "
                     f"KV head of {MLA_DECODE_D_QK} columns, V its first {MLA_DECODE_D_V}), got k_cache "
                     f"{tuple(getattr(k_cache, 'shape', ()))}")


class DecodeCalls:
    """Mixed into ExportedAttention: uses its ``_table_or_fallback``, ``_fallback``, ``_routes``, ``kernel``,
    ``stats``, ``_count_fallback``, ``last_*``; ``_decode_tables`` ({"paged"|"dense": per device dispatch tables of the
    decode configs}) and ``_decode_memo`` are built in its __init__."""

    def serves_decode(self, q, k_cache, v_cache, causal: bool, scale: float | None = None, window_size=(-1, -1),
                      softcap: float = 0.0, learnable_sink=None) -> bool:
        """Whether a decode call over this dense cache, with these options, would run an exported kernel: the route
        alone (dict lookups; traced by torch.compile), no call made and nothing counted. transformers' padded decode
        steps ask it before reading their cache in place (tuner/serving/padded.py)."""
        if decode_input_errors(q, k_cache, v_cache, None, None):
            return False
        options = PLAIN
        if learnable_sink is not None or softcap or (window_size is not None and tuple(window_size) != (-1, -1)):
            options = model_options(window_size, softcap, learnable_sink, causal=bool(causal), heads_q=int(q.shape[2]),
                                    device=q.device, where="flash_attn_with_kvcache",
                                    sink_dtypes=(torch.float32, q.dtype))
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        return op.route_config(self.route_decode(q, k_cache, v_cache, None, causal, scale, options)) is not None

    def route_decode(self, q, k_cache, v_cache, page_table, causal: bool, scale: float,
                     options: ModelOptions = PLAIN) -> int:
        """The route of a decode call (see the module doc): dict lookups and integer tests while tracing,
        memoised per call signature in eager. ``options`` (tuner/serving/options.py): only a decode config built
        with exactly the options the call needs serves it."""
        if torch.compiler.is_compiling():
            return self._decide_decode(q, k_cache, v_cache, page_table, causal, scale, options)
        key = (q.shape, k_cache.shape, v_cache.shape, None if page_table is None else page_table.shape, q.dtype,
               k_cache.dtype, v_cache.dtype, q.device, k_cache.device, v_cache.device, causal, scale,
               options.window, options.softcap > 0, options.sinks is not None)
        found = self._decode_memo.get(key)
        if found is None:
            if len(self._decode_memo) >= _MAX_MEMO:
                self._decode_memo.pop(next(iter(self._decode_memo)))
            found = self._decode_memo[key] = self._decide_decode(q, k_cache, v_cache, page_table, causal, scale,
                                                                 options)
        return found

    def _decide_decode(self, q, k_cache, v_cache, page_table, causal, scale, options: ModelOptions = PLAIN) -> int:
        paged = page_table is not None
        fp8 = k_cache.dtype == E4M3   # an FP8 cache: served by the configs of kv_dtype fp8 alone
        table, fallback = self._table_or_fallback(self._decode_tables["paged" if paged else "dense"], q, k_cache,
                                                  v_cache, scale, E4M3 if fp8 else None)
        if table is None:
            return fallback
        if not table:
            return self._fallback["no-decode-config"]
        if q.shape[1] > MAX_SEQLEN_Q:
            return self._fallback["decode-seqlen-q"]
        heads = dict(heads_q=int(q.shape[2]), heads_kv=int(k_cache.shape[2]), d_qk=int(q.shape[3]),
                     d_v=int(v_cache.shape[3]), dtype=dispatch_dtype(_DTYPE_NAMES.get(q.dtype), "fp8" if fp8 else ""))
        config, code = pick(table, causal=bool(causal), features=options.features(bool(causal)), **heads)
        if config is None and code in ("no-shape-config", "no-option-config") and q.shape[1] == 1:
            # one query token: bottom-right causal sees every key, so causal and non-causal kernels agree (a
            # window's right side then bounds nothing either); the reason stays the call's own causality's
            config = pick(table, causal=not causal, features=options.features(not causal), **heads)[0]
        if config is None:
            return self._fallback[code]
        page = k_cache.shape[1] if paged else None
        capacity = page_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        if not plain_ints(q.shape[0], capacity):
            return self._routes[(id(config), None)]          # a SymInt: the bucket is chosen per call
        bucket = config.decode_bucket_of_call(q.shape[0], capacity, page)
        if bucket is None:
            return self._fallback["decode-page-size"]
        return self._routes[(id(config), bucket)]

    def run_decode(self, route, q, k_cache, v_cache, cache_seqlens, page_table, causal: bool, scale: float,
                   num_splits: int, return_lse: bool, out=None, options: ModelOptions = PLAIN, cache_leftpad=None,
                   kv_scales=None):
        """(out, lse or an empty tensor) of a route: the exported decode kernel (given the options, for the
        kernel's causality, the leftpad and an FP8 cache's ``kv_scales`` (k_scale, v_scale)) or the reference
        (on the dequantised cache)."""
        args = (q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, return_lse, out, options, cache_leftpad,
                kv_scales)
        if route.config is None:
            return self._decode_reference(route.code, REASONS[route.code], *args)
        paged = page_table is not None
        page = int(k_cache.shape[1]) if paged else None
        capacity = int(page_table.shape[1]) * page if paged else int(k_cache.shape[1])
        bucket = route.bucket or route.config.decode_bucket_of_call(int(q.shape[0]), capacity, page)
        if bucket is None:
            return self._decode_reference("decode-page-size", REASONS["decode-page-size"], *args)
        entry = route.config.kernels[bucket]
        try:
            kern = self.kernel(entry, q.device.index or 0)
        except Exception as exc:  # noqa: BLE001 - any load failure means the reference, warned once
            return self._decode_reference("kernel-unloadable", f"kernel {entry.kernel_name} cannot be loaded: {exc}",
                                          *args)
        extra = {}
        if options.any:    # the launcher's names (FA4's learnable_sink)
            given = option_arguments(options, route.config.causal)
            extra = {"window_size": given["window_size"], "softcap": given["softcap"], "learnable_sink": given["sinks"]}
        if cache_leftpad is not None:
            extra["cache_leftpad"] = cache_leftpad
        if kv_scales is not None:
            extra["k_scale"], extra["v_scale"] = kv_scales
        try:
            res = kern(q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, softmax_scale=scale,
                       num_splits=num_splits or None, return_lse=return_lse, out=out, **extra)
        except ValueError as exc:   # refused before launch (strides, alignment, the page size, lengths)
            return self._decode_reference("inputs-refused", f"kernel {entry.kernel_name} refused the inputs: {exc}",
                                          *args)
        self.last_path, self.last_reason, self.last_bucket = ("kernel", f"{route.config.variant} decode "
                                                              f"{route.config.layout}", bucket)
        self.stats["kernel"] += 1
        if return_lse:
            return res
        return res, _no_lse(q)

    def _decode_reference(self, code, message, q, k_cache, v_cache, cache_seqlens, page_table, causal, scale,
                          return_lse, out, options=PLAIN, cache_leftpad=None, kv_scales=None):
        self._count_fallback(code, message)
        res, lse = decode_reference(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale, options,
                                    cache_leftpad, kv_scales)
        if out is not None:
            out.copy_(res)
            res = out
        return res, (lse if return_lse else _no_lse(q))

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale: float | None = None, causal: bool = False, window_size=(-1, -1),
                                softcap: float = 0.0, rotary_interleaved: bool = True, alibi_slopes=None,
                                num_splits: int = 0, return_softmax_lse: bool = False, *, page_table=None, out=None,
                                check_append: bool = True, learnable_sink=None, k_scale=None, v_scale=None,
                                q_descale=None, k_descale=None, v_descale=None):
        """``flash_attn.flash_attn_with_kvcache``'s signature and conventions (FlashAttention 2's positional order;
        ``page_table=``, ``out=`` and ``learnable_sink=`` as FA3/FA4 name them): see the module doc. Returns out, or
        (out, lse) with ``return_softmax_lse`` (the lse includes the sinks). ``num_splits`` 0 lets the kernel's split
        rule choose. ``window_size`` (left, right; -1 open, causal closes the right at 0), ``softcap`` and
        ``learnable_sink`` ((hq,) fp32 or q's dtype) are the model options of tuner/serving/options.py, aligned to
        each sequence's ``cache_seqlens``. ``cache_leftpad`` (b,) int32, a dense cache: each sequence's first key
        row (the module doc). ``k``/``v`` (and ``rotary_cos``/``rotary_sin``) append new rows to the
        cache in place first: tuner/serving/kvcache_append.py; ``check_append=False`` skips its host read of the
        lengths in eager calls (a synchronisation), as FA2 does. ``k_scale``/``v_scale`` (keyword-only): an FP8
        (torch.float8_e4m3fn) cache's fp32 scales, vLLM's convention (module doc: FP8 caches)."""
        for given, what in ((cache_batch_idx is not None, "cache_batch_idx"), (alibi_slopes is not None, "alibi_slopes")):
            if given:
                raise NotImplementedError(f"flash_attn_with_kvcache: {what} is not supported by the exported decode "
                                          "kernels (pass cache_seqlens= by keyword)")
        for given, what in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")):
            if given is not None:   # FA3's FP8 descales: (batch, kv_heads), fp8 queries too
                raise NotImplementedError(f"flash_attn_with_kvcache: {what} (FlashAttention-3's per-(batch, KV head) "
                                          "descale) is not taken: an FP8 (e4m3) cache takes k_scale=/v_scale= (vLLM's, "
                                          "per tensor or per KV head) and fp16/bf16 queries")
        if block_table is not None and page_table is not None and block_table is not page_table:
            raise ValueError("flash_attn_with_kvcache: block_table and page_table name the same thing; give one")
        table = block_table if block_table is not None else page_table
        absorbed = v_cache is None
        if absorbed:
            v_cache = absorbed_mla_values(q, k_cache)
        errors = decode_input_errors(q, k_cache, v_cache, cache_seqlens, table)
        if not errors:
            errors += append_errors(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, absorbed,
                                    table)
        if cache_leftpad is not None and not errors:
            errors += leftpad_errors(q, cache_leftpad, table)
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
            errors.append(f"num_splits must be an int >= 0 (0: the kernel's split rule), got {num_splits!r}")
        if not errors:
            errors += fp8_cache_errors(q, k_cache, v_cache, k_scale, v_scale)
        if errors:
            raise ValueError("flash_attn_with_kvcache: " + "; ".join(errors))
        fp8 = k_cache.dtype == E4M3
        if fp8 and absorbed:   # absorbed MLA's values are the latent rows' first columns: their scale is k_scale
            if v_scale is not None and v_scale is not k_scale:
                raise ValueError("flash_attn_with_kvcache: absorbed MLA (v_cache=None) reads V from k_cache's latent "
                                 "rows, so their scale is k_scale: pass v_scale=None or k_scale itself")
            v_scale = k_scale
        if fp8:   # the scales: before anything is appended or launched (a host read of their values in eager calls)
            try:
                check_kv_scales({"k_scale": k_scale, "v_scale": v_scale}, int(k_cache.shape[2]), k_cache.device,
                                check_finite=host_reads_allowed())
            except ValueError as exc:
                raise ValueError(f"flash_attn_with_kvcache: {exc}") from None
        options = PLAIN
        if learnable_sink is not None or softcap or (window_size is not None and tuple(window_size) != (-1, -1)):
            options = model_options(window_size, softcap, learnable_sink, causal=bool(causal),
                                    heads_q=int(q.shape[2]), device=q.device, where="flash_attn_with_kvcache",
                                    sink_dtypes=(torch.float32, q.dtype))
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (b, sq, hq, v_cache.shape[3])
                                or out.dtype != q.dtype or out.device != q.device):
            raise ValueError(f"flash_attn_with_kvcache: out must be a {q.dtype} tensor of shape "
                             f"{(b, sq, hq, v_cache.shape[3])} on {q.device}")
        scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(int(q.shape[3]))
        if isinstance(cache_seqlens, int):
            cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
        elif cache_seqlens is None and table is not None:     # FA2: a paged cache without lengths is full
            cache_seqlens = torch.full((b,), table.shape[1] * k_cache.shape[1], dtype=torch.int32, device=q.device)
        elif cache_seqlens is not None and (cache_seqlens.dtype != torch.int32 or cache_seqlens.stride(0) != 1):
            cache_seqlens = cache_seqlens.to(torch.int32).contiguous()
        if cache_leftpad is not None and cache_leftpad.stride(0) != 1:
            cache_leftpad = cache_leftpad.contiguous()
        if k is not None:   # the new rows into the cache (in place), rotated; the attention reads them too
            q, cache_seqlens = append(q, k_cache, v_cache, k, v, cache_seqlens, table, rotary_cos, rotary_sin,
                                      bool(rotary_interleaved), bool(causal), absorbed, bool(check_append),
                                      (k_scale, v_scale) if fp8 else None)
        route = self.route_decode(q, k_cache, v_cache, table, causal, scale, options)
        if fp8:
            res, lse = launch_decode_fp8(q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, table, bool(causal),
                                         scale, int(num_splits), bool(return_softmax_lse), options, route, out,
                                         cache_leftpad)
        elif options.any:
            res, lse = launch_decode_options(q, k_cache, v_cache, cache_seqlens, table, bool(causal), scale,
                                             int(num_splits), bool(return_softmax_lse), options, route, out,
                                             cache_leftpad)
        else:
            res, lse = op.launch_decode(q, k_cache, v_cache, cache_seqlens, table, bool(causal), scale,
                                        int(num_splits), bool(return_softmax_lse), route, out, cache_leftpad)
        return (res, lse) if return_softmax_lse else res


def fp8_cache_errors(q, k_cache, v_cache, k_scale, v_scale) -> list[str]:
    """Why these caches and scales are not a decode call over an FP8 cache nor over a 16-bit one (empty: they are
    one of them): e4m3 caches both or neither, read by fp16/bf16 queries, with k_scale and v_scale; a 16-bit cache
    with none. The scales themselves: check_kv_scales."""
    k8, v8 = k_cache.dtype == E4M3, v_cache.dtype == E4M3
    if k8 != v8:
        return [f"k_cache and v_cache must both be {E4M3} (an FP8 cache) or neither, got {k_cache.dtype} and "
                f"{v_cache.dtype}"]
    if not k8:
        given = [n for n, t in (("k_scale", k_scale), ("v_scale", v_scale)) if t is not None]
        return [f"{' and '.join(given)} go with an FP8 ({E4M3}) cache; this one is {k_cache.dtype}"] if given else []
    if q.dtype not in _DTYPE_NAMES:
        return [f"an FP8 ({E4M3}) cache is read by fp16 or bf16 queries, got q {q.dtype}"]
    return []


def _no_lse(q):
    return torch.empty((0,), dtype=torch.float32, device=q.device)
