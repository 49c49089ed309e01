"""A launch plan: one call signature (shapes, strides, dtypes, device, softmax scale) of one kernel,
validated once and packed into the parameter buffer cuLaunchKernel reads (tuner/serving/launch/kernel.py launches it).

The buffer holds the four data pointers first (one pack per call), then the tile counter, the scalars, and
the 128-byte TMA descriptors 64-byte aligned; ``pointers`` says where each argument lies, in the kernel's
order. Pure apart from the descriptors' encoding (tuner.serving.launch.tma), so the layout is CPU-tested argument by
argument (tests/test_runtime.py).
"""
from __future__ import annotations

import ctypes
import math
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from kernel_abi.spec import OUTPUT_DTYPES, TORCH_DTYPES as _DTYPES

_LOG2E = math.log2(math.e)


class PlanError(RuntimeError):
    """The kernel takes an argument this runtime does not know how to fill."""


def _arg_slots(args) -> tuple[dict, int]:
    """Byte offset of each kernel argument in the parameter buffer: the four data pointers first (one
    pack per call), then the tile counter, the scalars, and the 128-byte TMA descriptors 64-byte aligned."""
    order = ["q", "k", "v", "o", "tile_counter"]
    offsets, at = {}, 0
    for name in order:
        if any(a == name for a, _ in args):
            offsets[name] = order.index(name) * 8
    at = 40
    for name, kind in args:
        if name in offsets or kind.startswith("tensormap:"):
            continue
        offsets[name] = at
        at += 8
    at = (at + 63) // 64 * 64
    for name, kind in args:
        if kind.startswith("tensormap:"):
            offsets[name] = at
            at += 128
    return offsets, at


_SCALAR_FORMAT = {"i32": "<i", "i64": "<q", "f32": "<f", "ptr": "<Q"}
FOUR_POINTERS = struct.Struct("<4Q")     # q, k, v, out at offset 0
POINTER = struct.Struct("<Q")


@dataclass
class LaunchPlan:
    """One call signature, validated and packed: what a launch writes per call is only the pointers."""

    grid: tuple
    out_shape: tuple
    params: Any                  # ctypes buffer of every argument's bytes
    pointers: Any                # (c_void_p * n): where each argument lies, in the kernel's order
    prefix: tuple                # cuLaunchKernel's arguments before the stream: function, grid, block, smem
    pointers_address: int
    maps: list                   # MapSlot per TMA descriptor, kept pointing at the call's tensors
    persistent_counter: bool
    lock: Any
    dynamic_offsets: tuple = ()  # where per-call pointers beyond q, k, v, out go (a layout's: VARLEN_POINTERS)
    out_dtype: Any = None        # torch dtype of the output (an FP8 kernel's is bf16); None: the inputs'


@dataclass
class MapSlot:
    """A TMA descriptor in a plan's parameter buffer and the address it holds now."""

    offset: int
    index: int               # of the tensor in (q, k, v, out)
    spec: Any
    dtype: str
    address: int
    address_offset: int | None


class _ShapeProbe:
    """Stands in for a tensor that does not exist yet while a plan is built (the output; an FP8 kernel's transposed
    V): its shape, strides (contiguous unless given) and a 16-byte-aligned address (the real one is written per
    call)."""

    def __init__(self, shape, element_size: int, strides=None):
        self.shape = shape
        if strides is None:
            strides = [1] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                strides[i] = strides[i + 1] * shape[i + 1]
        self._strides = list(strides)
        self._element_size = element_size

    def stride(self, axis=None):
        return tuple(self._strides) if axis is None else self._strides[axis]

    def element_size(self) -> int:
        return self._element_size

    def data_ptr(self) -> int:
        return 1 << 20


def _scale_of(kernel, softmax_scale) -> float:
    spec = kernel.meta["spec"]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(spec["d_qk"])
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    if not kernel.takes_scale and not math.isclose(scale, 1.0 / math.sqrt(spec["d_qk"]), rel_tol=1e-6):
        raise ValueError(f"{kernel.name} (ABI 1) computes the softmax scale 1/sqrt({spec['d_qk']}); "
                         f"{scale} needs a rebuilt kernel")
    return scale


@dataclass(frozen=True)
class CallOptions:
    """A call's options of kernel_abi.spec (FlashAttention's conventions): ``window`` (left, right), -1 open;
    ``softcap`` 0 none; ``sinks`` a tensor of one fp32 logit per query head, or None. Hashable but for the sinks
    tensor, which goes into a plan's key as present or not (its pointer is written per call)."""

    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: Any = None

    def key(self) -> tuple:
        return (self.window, self.softcap, self.sinks is not None)


NO_OPTIONS = CallOptions()
_OPTION_TEXT = {"local": "a sliding window (window_size)", "softcap": "soft-capping (softcap)",
                "sinks": "attention sinks (learnable_sink)"}


def option_values(kernel, options: CallOptions, heads_q: int, device, scale: float) -> dict:
    """The kernel arguments of a call's options, and the exponent scale (softmax_scale_log2: the softmax scale, or
    with soft-capping the cap, times log2(e)). ValueError, before any launch, for an option the kernel was not built
    with, one it was built with and the call lacks (a soft-capping kernel always caps, a sinks kernel always adds
    them), or a malformed value."""
    spec = kernel.meta["spec"]
    window = tuple(options.window) if options.window is not None else (-1, -1)
    if len(window) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window):
        raise ValueError(f"window_size must be (left, right) ints >= -1 (-1: unbounded), got {options.window!r}")
    causal = bool(spec.get("causal"))
    local = window[0] >= 0 or (window[1] >= 0 and not causal)
    softcap = options.softcap or 0.0
    if not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0, got {options.softcap!r}")
    asked = {"local": local, "softcap": softcap > 0, "sinks": options.sinks is not None}
    for option, given in asked.items():
        built = bool(spec.get(option))
        if given and not built:
            raise ValueError(f"{kernel.name} was built without {_OPTION_TEXT[option]}: the call needs a kernel built with "
                             f"{option}")
        if built and not given and option != "local":
            raise ValueError(f"{kernel.name} is built with {_OPTION_TEXT[option]}: the call must give it")
    values = {"softmax_scale_log2": (softcap if softcap > 0 else scale) * _LOG2E}
    if spec.get("local"):
        values.update(window_left=window[0], window_right=0 if causal else window[1])
    if softcap > 0:
        values["softcap_prescale"] = scale / softcap
    if options.sinks is not None:
        t = options.sinks
        import torch

        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (heads_q,) \
                or t.device != device or t.stride(0) != 1:
            raise ValueError(f"sinks (learnable_sink) must be a contiguous fp32 tensor of {heads_q} logits (one per "
                             f"query head) on {device}, got {getattr(t, 'dtype', type(t).__name__)} "
                             f"{tuple(getattr(t, 'shape', ()))}")
    return values


def _check_out(out, out_shape, dtype, device) -> None:
    if out is not None:
        if tuple(out.shape) != out_shape or out.dtype != dtype or out.device != device:
            raise ValueError(f"out must be {out_shape} {dtype} on {device}; got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}")
        _check_layout("out", out)


# A packed-heads kernel's consumer warpgroup holds 64 rows, whole tokens of the heads a tile holds
# (translate/params_sm90.py PACK_ROWS; the runtime does not import the translator).
PACK_ROWS = 64


def packed_heads(meta: dict) -> bool:
    """The kernel packs the query heads of a KV head into its tiles' rows (pack_gqa: its Q map is heads first)."""
    return bool(meta.get("tensor_maps", {}).get("q", {}).get("heads_first"))


def heads_per_tile(meta: dict, group: int) -> int:
    """The query heads one tile of the kernel holds for a call with this group: a packed-heads kernel takes the
    whole group where it divides 64, else one head a tile (the unpacked walk, in the same kernel); others one."""
    return group if packed_heads(meta) and PACK_ROWS % group == 0 else 1


def _grid(kernel, batch: int, heads_q: int, seqlen_q: int, group: int = 1) -> tuple:
    block_m = int(kernel.meta["block_m"])
    pack = heads_per_tile(kernel.meta, group)
    tokens = block_m // pack   # a tile: block_m / pack tokens of its pack heads
    m_blocks, heads_q = (seqlen_q + tokens - 1) // tokens, heads_q // pack
    grid_kind = kernel.meta.get("grid")
    if grid_kind in ("tiles", "persistent"):
        tiles = m_blocks * heads_q * batch
        return (min(tiles, kernel._sm_count) if grid_kind == "persistent" else tiles, 1, 1)
    if heads_q > 65535 or batch > 65535:
        raise ValueError(f"heads ({heads_q}) and batch ({batch}) must each be <= 65535")
    return (m_blocks, heads_q, batch)


def build_plan(kernel, q, k, v, out, softmax_scale, options: CallOptions = NO_OPTIONS) -> LaunchPlan:
    """Validate one call signature against ``kernel`` (an AttentionKernel) and pack everything it fixes;
    ValueError for inputs the kernel cannot take, before any launch."""
    import torch

    spec = kernel.meta["spec"]
    if spec.get("layout", "dense") != "dense":
        raise ValueError(f"{kernel.name} takes packed sequences (cu_seqlens): call its varlen entry")
    dtype = getattr(torch, _DTYPES[spec["dtype"]])
    out_dtype = getattr(torch, _DTYPES[OUTPUT_DTYPES[spec["dtype"]]])
    _check_inputs(q, k, v, dtype, spec)
    if q.device.index != kernel.device_index:
        raise ValueError(f"{kernel.name} is loaded on cuda:{kernel.device_index}; the tensors are on {q.device}")
    b, sq, hq, _ = q.shape
    _, sk, hkv, _ = k.shape
    out_shape = (b, sq, hq, spec["d_v"])
    _check_out(out, out_shape, out_dtype, q.device)
    values = {"seqlen_q": sq, "seqlen_k": sk, "group": hq // hkv, "heads_q": hq, "batch": b,
              "pack": heads_per_tile(kernel.meta, hq // hkv),
              **option_values(kernel, options, hq, q.device, _scale_of(kernel, softmax_scale))}
    probe_out = out if out is not None else _ShapeProbe(out_shape, out_dtype.itemsize)
    if transposes_v(kernel.meta):   # the map addresses V^T (batch, d, heads, keys); the call's copy comes per call
        v = transposed_v(v, alloc=False, order=vt_key_order(kernel.meta))
    plan = _pack_plan(kernel, {"q": q, "k": k, "v": v, "o": probe_out}, values, _grid(kernel, b, hq, sq, hq // hkv),
                      out_shape, dynamic=sink_pointer(kernel) + descale_pointers(kernel))
    plan.out_dtype = out_dtype
    return plan


def packed_vt_align(meta: dict) -> int:
    """Keys at whose multiples a packed FP8 kernel reads each sequence's V^T (the kernel's kPackedVtAlign)."""
    return int(meta["tensor_maps"]["v"].get("seq_align", V_KEY_ALIGN))


def transposes_v(meta: dict) -> bool:
    """The kernel reads V transposed, (batch, heads, d, keys): an FP8 kernel (8-bit wgmma operands are K-major) whose
    V^T the runtime copies per call. An FP8 kernel built with the in-kernel transpose (translate's KernelParams.v_transpose
    "producer") reads V as given: its map has no ``transposed``, and the call makes no copy."""
    return bool(meta.get("tensor_maps", {}).get("v", {}).get("transposed"))


def vt_key_order(meta: dict) -> str:
    """The order of the keys in the kernel's transposed V (translate's KernelParams.vt_key_order): "natural", or
    "accumulator" (within 16 keys, as P's accumulator holds them: vt_column)."""
    return str(meta.get("tensor_maps", {}).get("v", {}).get("key_order", "natural"))


V_KEY_ALIGN = 16   # keys of a transposed V row, rounded up: TMA strides are multiples of 16 bytes
VT_GROUP = 16      # keys a V^T column permutation of the "accumulator" order stays within


def vt_column(key, order: str):
    """The V^T column of ``key`` (an int or an integer tensor, counted from a 16-aligned start: a sequence's first
    key): itself in "natural" order; in "accumulator" order key 8h + 2q + b of each 16 at column 4q + 2h + b, where
    a thread of quad lane q holds keys 2q, 2q + 1, 8 + 2q, 9 + 2q of P's wgmma accumulator per 16 (so the FP8 kernel
    converts P to its A operand without moving values between lanes: attn_sm90.cuh convert_p_fp8_in_place)."""
    if order == "natural":
        return key
    return key - key % VT_GROUP + 4 * ((key >> 1) & 3) + 2 * ((key >> 3) & 1) + (key & 1)


def vt_key(column, order: str):
    """vt_column's inverse: the key (from the 16-aligned start) at ``column`` (an int or an integer tensor)."""
    if order == "natural":
        return column
    return column - column % VT_GROUP + 8 * ((column >> 1) & 1) + 2 * ((column >> 2) & 3) + (column & 1)


def _vt_keys(sk: int, order: str) -> int:
    """The key extent of a V^T map: ``sk``, or in accumulator order the whole last group of 16 (a key of it may sit
    past ``sk``; the TMA box reads zeros only past the extent)."""
    return sk if order == "natural" else -(-sk // VT_GROUP) * VT_GROUP


def transposed_v(v, alloc: bool = True, order: str = "natural"):
    """V (batch, keys, heads, d) as an FP8 kernel's TMA map reads it: a (batch, d, heads, keys) view of a new
    (batch, heads, d, keys rounded up to V_KEY_ALIGN) tensor holding V^T (one copy of V: 1 byte an element), its keys
    in ``order`` (vt_column; the view then spans the last group of 16, zeros past the keys). ``alloc`` False: only
    the view's geometry (a plan's probe)."""
    b, sk, h, d = (int(x) for x in v.shape)
    skp = -(-sk // V_KEY_ALIGN) * V_KEY_ALIGN
    keys = _vt_keys(sk, order)
    if not alloc:
        return _ShapeProbe((b, d, h, keys), v.element_size(), (h * d * skp, skp, d * skp, 1))
    import torch

    buf = torch.empty((b, h, d, skp), dtype=v.dtype, device=v.device)
    from tuner.serving.launch.transpose_triton import transpose_into

    if not (v.is_cuda and v.stride(-1) == 1 and transpose_into(buf, v, keys, order == "accumulator")):
        if order == "natural":
            buf[..., :sk].copy_(v.permute(0, 2, 3, 1))
        else:
            buf.view(torch.uint8).zero_()
            at = vt_column(torch.arange(sk, device=v.device), order)
            buf.view(torch.uint8).index_copy_(3, at, v.view(torch.uint8).permute(0, 2, 3, 1))
    return buf[..., :keys].permute(0, 2, 1, 3)


def packed_vt_keys(total: int, batch: int, align: int) -> int:
    """Keys of a row of packed sequences' V^T: each sequence from its first key rounded up to ``align``, plus ``align``
    per sequence before it (attn_sm90::packed_vt_key0), rounded up to V_KEY_ALIGN."""
    keys = -(-total // align) * align + align * batch
    return -(-keys // V_KEY_ALIGN) * V_KEY_ALIGN


def packed_vt_probe(heads: int, d: int, keys: int, element_size: int) -> _ShapeProbe:
    """The geometry of a packed V^T of ``keys`` keys a row, (1, d, heads, keys) over (1, heads, d, keys): what the map
    of an FP8 varlen or paged kernel's V addresses."""
    return _ShapeProbe((1, d, heads, keys), element_size, (heads * d * keys, keys, d * keys, 1))


def transposed_packed_v(v, cu_seqlens_k, batch: int, align: int, alloc: bool = True, order: str = "natural"):
    """Packed V (total keys, heads, d) as an FP8 varlen kernel's TMA map reads it: a (1, d, heads, keys) view of a
    zeroed (1, heads, d, packed_vt_keys) tensor in which sequence b's keys start at key align x ceil(cu_seqlens_k[b]
    / align) + align x b (a box's innermost start is 16-byte aligned; the zeros between sequences meet P = 0 in the
    P.V GEMM, where uninitialised bytes could hold e4m3 NaN), in ``order`` from there (vt_column: a sequence's last
    group of 16 fits before the next sequence's start, which is more than its keys further and a multiple of 16).
    ``alloc`` False: the geometry only."""
    if order != "natural" and align % VT_GROUP:
        raise ValueError(f"a V^T in {order} order needs sequences from multiples of {VT_GROUP} keys, not {align}")
    total, h, d = (int(x) for x in v.shape)
    keys = packed_vt_keys(total, batch, align)
    if not alloc:
        return packed_vt_probe(h, d, keys, v.element_size())
    import torch

    from tuner.serving.launch.transpose_triton import transpose_packed_into

    if v.is_cuda and v.stride(-1) == 1:   # one launch: the copy and the zeros between sequences
        buf = torch.empty((1, h, d, keys), dtype=v.dtype, device=v.device)
        if transpose_packed_into(buf, v, cu_seqlens_k, batch, align, order == "accumulator"):
            return buf.permute(0, 2, 1, 3)
    buf = torch.zeros((1, h, d, keys), dtype=v.dtype, device=v.device)
    if total and batch:
        starts = cu_seqlens_k[:batch].to(torch.int64)
        first = (starts + align - 1) // align * align + align * torch.arange(batch, device=v.device)
        at = torch.arange(total, device=v.device)
        seq = torch.searchsorted(cu_seqlens_k[1:batch + 1].to(torch.int64), at, right=True).clamp_(max=batch - 1)
        column = first[seq] + vt_column(at - starts[seq], order)
        buf.view(torch.uint8)[0].index_copy_(2, column, v.view(torch.uint8).permute(1, 2, 0))
    return buf.permute(0, 2, 1, 3)


FP8_DESCALES = ("q_descale", "k_descale", "v_descale")
# Descale tensors found finite, by id: (a weak reference to the tensor, the version (torch's in-place write counter) it
# had then). A model passes the same scales every call, and reading them back is a host sync each time.
_FINITE_SEEN: dict = {}


def _seen_finite(t) -> bool:
    seen = _FINITE_SEEN.get(id(t))
    return seen is not None and seen[0]() is t and seen[1] == t._version


def _remember_finite(t) -> None:
    if len(_FINITE_SEEN) > 1024:   # (dead entries: tensors freed since)
        for key in [k for k, (ref, _) in _FINITE_SEEN.items() if ref() is None]:
            del _FINITE_SEEN[key]
    _FINITE_SEEN[id(t)] = (weakref.ref(t), t._version)


def descale_pointers(kernel) -> tuple:
    """The per-call pointers of an FP8 kernel (after its layout's and the sinks'): its three descales."""
    return FP8_DESCALES if kernel.meta["spec"].get("dtype") == "fp8" else ()


def check_descales(descales: dict, batch: int, heads_kv: int, device, check_finite: bool = True) -> None:
    """FlashAttention-3's FP8 descales: each of q_descale, k_descale, v_descale a contiguous fp32 tensor of shape
    (batch, KV heads) on the inputs' device with finite values (``check_finite`` reads them: a host sync, skipped
    while a CUDA graph is captured). ValueError naming the argument, before any launch."""
    for name in FP8_DESCALES:
        t = descales.get(name)
        if t is None:
            raise ValueError(f"{name} is missing: an FP8 call needs q_descale, k_descale and v_descale, fp32 of shape "
                             f"({batch}, {heads_kv}) (batch, KV heads); pass ones for unscaled inputs")
        _check_scale(name, t, ((batch, heads_kv),), f"({batch}, {heads_kv}) (batch, KV heads)", device, check_finite)


KV_SCALES = ("k_scale", "v_scale")


def kv_scale_shapes(heads_kv: int) -> tuple:
    """The shapes an FP8 KV cache's k_scale / v_scale may have: one scale for the cache (a 0-d or 1-element tensor,
    vLLM's per-tensor scale) or one per KV head."""
    return ((), (1,), (heads_kv,))


def check_kv_scales(scales: dict, heads_kv: int, device, check_finite: bool = True) -> None:
    """An FP8 (e4m3) KV cache's scales, vLLM's convention (the real K is k_cache * k_scale): k_scale and v_scale each
    a contiguous fp32 tensor of one element or of one per KV head, on the cache's device, finite (``check_finite``
    reads them: a host sync, skipped while a CUDA graph is captured). ValueError naming the argument, before any
    launch."""
    for name in KV_SCALES:
        t = scales.get(name)
        if t is None:
            raise ValueError(f"{name} is missing: an FP8 (e4m3) KV cache needs k_scale and v_scale, fp32 of one "
                             f"element (per tensor) or ({heads_kv},) (per KV head); the real K is k_cache * k_scale")
        _check_scale(name, t, kv_scale_shapes(heads_kv), f"() or (1,) (per tensor) or ({heads_kv},) (per KV head)",
                     device, check_finite)


def _check_scale(name: str, t, shapes, shape_text: str, device, check_finite: bool) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be fp32, got {t.dtype}")
    if tuple(t.shape) not in shapes:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; the inputs are on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    if check_finite and not _seen_finite(t):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} holds values that are not finite")
        _remember_finite(t)


VARLEN_POINTERS = ("cu_seqlens_q", "cu_seqlens_k", "seqused_k")   # written per call, like the data pointers


def sink_pointer(kernel) -> tuple:
    """The per-call pointer of a sinks kernel (after its layout's): its sinks tensor."""
    return ("sinks",) if kernel.meta["spec"].get("sinks") else ()


def build_varlen_plan(kernel, q, k, v, out, softmax_scale, batch: int, max_seqlen_q: int,
                      max_seqlen_k: int, options: CallOptions = NO_OPTIONS) -> LaunchPlan:
    """The plan of a varlen kernel: q (total_q, hq, d_qk), k (total_k, hkv, d_qk), v (total_k, hkv, d_v) ->
    out (total_q, hq, d_v); ``batch`` sequences, none longer than ``max_seqlen_q`` / ``max_seqlen_k``
    (FlashAttention's contract: the grid is sized by them). The tensors are seen as one 'batch' of
    (1, total, heads, dim), which is what the kernel's TMA descriptors address."""
    import torch

    spec = kernel.meta["spec"]
    if spec.get("layout", "dense") != "varlen":
        raise ValueError(f"{kernel.name} takes (batch, seqlen, heads, dim) tensors, not packed sequences")
    dtype = getattr(torch, _DTYPES[spec["dtype"]])
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not hasattr(t, "dim") or t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, heads, head_dim) for packed sequences, "
                             f"got {tuple(getattr(t, 'shape', ()))}")
    if batch < 1 or max_seqlen_q < 0 or max_seqlen_k < 0:
        raise ValueError(f"batch {batch}, max_seqlen_q {max_seqlen_q}, max_seqlen_k {max_seqlen_k}: batch >= 1, "
                         "lengths >= 0")
    q4, k4, v4 = (_Packed(t) for t in (q, k, v))
    _check_inputs(q4, k4, v4, dtype, spec, packed=True)
    if q.device.index != kernel.device_index:
        raise ValueError(f"{kernel.name} is loaded on cuda:{kernel.device_index}; the tensors are on {q.device}")
    total_q, hq, _ = q.shape
    hkv = k.shape[1]
    out_shape = (total_q, hq, spec["d_v"])
    out_dtype = getattr(torch, _DTYPES[OUTPUT_DTYPES[spec["dtype"]]])
    _check_out(out, out_shape, out_dtype, q.device)
    values = {"seqlen_q": max(1, max_seqlen_q), "seqlen_k": max(1, max_seqlen_k), "group": hq // hkv,
              "heads_q": hq, "batch": batch,
              **option_values(kernel, options, hq, q.device, _scale_of(kernel, softmax_scale))}
    probe_out = _Packed(out if out is not None else _ShapeProbe(out_shape, out_dtype.itemsize))
    if transposes_v(kernel.meta):   # V^T of the packed keys, (1, d, heads, keys): copied per call
        v4 = transposed_packed_v(v, None, batch, packed_vt_align(kernel.meta), alloc=False)
    plan = _pack_plan(kernel, {"q": q4, "k": k4, "v": v4, "o": probe_out}, values,
                      _grid(kernel, batch, hq, max(1, max_seqlen_q)), out_shape,
                      dynamic=VARLEN_POINTERS + sink_pointer(kernel) + descale_pointers(kernel))
    plan.out_dtype = out_dtype
    return plan


PAGED_POINTERS = VARLEN_POINTERS + ("page_table",)


def build_paged_plan(kernel, q, k_cache, v_cache, out, softmax_scale, batch: int, max_seqlen_q: int,
                     page_table_stride: int, options: CallOptions = NO_OPTIONS,
                     vt_keys: int | None = None) -> LaunchPlan:
    """The plan of a paged kernel: packed q (total_q, hq, d_qk) and out, keys and values in caches
    (pages, page_size, hkv, d) found through a page table (int32, batch x its row stride). The page size
    must divide block N or be a multiple of it: a tile is read in boxes of min(block N, page size) rows. An FP8
    kernel reads K from the pages and V from the packed V^T of ``vt_keys`` keys the runtime gathers per call
    (tuner/serving/launch/paged_vt.py), and writes bf16."""
    import torch

    from tuner.serving.launch.paging import fp8_page_misfit, kv_copy_of, page_misfit

    spec = kernel.meta["spec"]
    if spec.get("layout", "dense") != "paged":
        raise ValueError(f"{kernel.name} does not read a paged cache (its layout is {spec.get('layout', 'dense')})")
    dtype = getattr(torch, _DTYPES[spec["dtype"]])
    out_dtype = getattr(torch, _DTYPES[OUTPUT_DTYPES[spec["dtype"]]])
    if not hasattr(q, "dim") or q.dim() != 3:
        raise ValueError(f"q must be 3-D (total_tokens, heads, head_dim), got {tuple(getattr(q, 'shape', ()))}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not hasattr(t, "dim") or t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (pages, page_size, heads, head_dim), got "
                             f"{tuple(getattr(t, 'shape', ()))}")
    if k_cache.shape[:3] != v_cache.shape[:3] and tuple(k_cache.shape[:3]) != tuple(v_cache.shape[:3]):
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in pages, "
                         "page size or heads")
    page_size, block_n = int(k_cache.shape[1]), int(kernel.meta["block_n"])
    misfit = page_misfit(page_size, block_n, kv_copy_of(kernel.meta))
    if misfit is None and spec.get("dtype") == "fp8":   # K's e4m3 boxes a page (and V's, read as given or not)
        misfit = fp8_page_misfit(page_size)
    if misfit is not None:
        raise ValueError(misfit)
    q4 = _Packed(q)
    _check_inputs(q4, k_cache, v_cache, dtype, spec, packed=True, paged=True)
    if q.device.index != kernel.device_index:
        raise ValueError(f"{kernel.name} is loaded on cuda:{kernel.device_index}; the tensors are on {q.device}")
    total_q, hq, _ = q.shape
    hkv = k_cache.shape[2]
    out_shape = (total_q, hq, spec["d_v"])
    _check_out(out, out_shape, out_dtype, q.device)
    values = {"seqlen_q": max(1, max_seqlen_q), "seqlen_k": 1, "group": hq // hkv, "heads_q": hq, "batch": batch,
              "page_table_stride": page_table_stride, "page_size": page_size,
              **option_values(kernel, options, hq, q.device, _scale_of(kernel, softmax_scale))}
    probe_out = _Packed(out if out is not None else _ShapeProbe(out_shape, out_dtype.itemsize))
    box_rows = {"k": min(block_n, page_size), "v": min(block_n, page_size)}
    if transposes_v(kernel.meta):   # V^T of the gathered keys (tuner/serving/launch/paged_vt.py): the kernel's boxes
        if vt_keys is None:
            raise PlanError(f"{kernel.name} reads V^T gathered from the pages: its plan needs the V^T's keys")
        v_cache = packed_vt_probe(int(v_cache.shape[2]), int(v_cache.shape[3]), vt_keys, v_cache.element_size())
        del box_rows["v"]
    plan = _pack_plan(kernel, {"q": q4, "k": k_cache, "v": v_cache, "o": probe_out}, values,
                      _grid(kernel, batch, hq, max(1, max_seqlen_q)), out_shape,
                      dynamic=PAGED_POINTERS + sink_pointer(kernel) + descale_pointers(kernel), box_rows=box_rows)
    plan.out_dtype = out_dtype
    return plan


class _Packed:
    """A (total, heads, dim) tensor seen as (1, total, heads, dim): the one 'batch' of packed sequences."""

    def __init__(self, t):
        self.t = t
        s0, s1, s2 = t.stride()
        self.shape = (1, max(1, t.shape[0]), *t.shape[1:])   # no tile reads an empty tensor; its map needs a row
        self._strides = (max(1, t.shape[0]) * s0, s0, s1, s2)
        self.dtype, self.device = getattr(t, "dtype", None), getattr(t, "device", None)
        self.is_cuda = getattr(t, "is_cuda", True)

    def stride(self, axis=None):
        return self._strides if axis is None else self._strides[axis]

    def dim(self) -> int:
        return 4

    def data_ptr(self) -> int:
        return self.t.data_ptr()

    def element_size(self) -> int:
        return self.t.element_size()


def _pack_plan(kernel, tensors: dict, values: dict, grid: tuple, out_shape: tuple, dynamic=(),
               box_rows: dict | None = None) -> LaunchPlan:
    """The buffer: ``values`` (scalars), each 4-D tensor's strides, the TMA descriptors; the pointers of
    q, k, v, out (and ``dynamic``'s) are written per call."""
    values = dict(values)
    for name, t in tensors.items():
        for axis, what in enumerate(("batch", "row", "head")):
            values[f"{name}_{what}_stride"] = t.stride(axis)
    args = kernel.args
    offsets, size = _arg_slots(args)
    params = ctypes.create_string_buffer(size)
    maps = []
    boxes = {t: dict(box, **({"rows": box_rows[t]} if box_rows and t in box_rows else {}))
             for t, box in kernel.meta.get("tensor_maps", {}).items()}
    for name, kind in args:
        at = offsets[name]
        if kind.startswith("tensormap:"):
            maps.append(_first_map(kernel.meta, params, at, kind.split(":", 1)[1], tensors, boxes,
                                   int(values.get("pack", 1))))
        elif name not in ("q", "k", "v", "o", "tile_counter") and name not in dynamic:
            if name not in values:
                raise PlanError(f"{kernel.name} takes an argument {name!r} this runtime does not know")
            struct.pack_into(_SCALAR_FORMAT[kind], params, at, values[name])
    missing = [name for name in dynamic if name not in offsets]
    if missing:
        raise PlanError(f"{kernel.name} lacks the arguments {missing} of its layout")
    base = ctypes.addressof(params)
    pointers = (ctypes.c_void_p * len(args))(*[base + offsets[name] for name, _ in args])
    prefix = (kernel._function, grid[0], grid[1], grid[2], int(kernel.meta["num_threads"]), 1, 1,
              int(kernel.meta["smem_bytes"]))
    return LaunchPlan(grid=grid, out_shape=out_shape, params=params, pointers=pointers, prefix=prefix,
                      pointers_address=ctypes.addressof(pointers), maps=maps,
                      persistent_counter=any(name == "tile_counter" for name, _ in args),
                      lock=threading.Lock(), dynamic_offsets=tuple(offsets[name] for name in dynamic))


def _first_map(meta: dict, params, at: int, tensor: str, tensors: dict, boxes: dict, pack: int = 1) -> "MapSlot":
    from tuner.serving.launch import tma

    t = tensors[tensor]
    box = boxes[tensor]
    try:
        spec = tma.tensor_map_spec(t.data_ptr(), t.shape, t.stride(), t.element_size(), int(box["rows"]),
                                   pack if box.get("heads_first") else 0, int(box.get("cols", tma.BOX_COLUMNS)),
                                   ragged=bool(box.get("transposed")))
    except tma.TensorMapError as exc:
        raise ValueError(f"{tensor}: {exc}") from None
    dtype = meta["spec"]["dtype"]
    return place_map(params, at, "qkvo".index(tensor), spec, OUTPUT_DTYPES[dtype] if tensor == "o" else dtype)


def place_map(params, at: int, index: int, spec, dtype: str) -> MapSlot:
    """``spec``'s descriptor encoded into the ctypes buffer ``params`` at byte ``at``, and the slot that keeps it
    pointing at the call's tensor ``index`` of (q, k, v, out) (point_map)."""
    from tuner.serving.launch import tma

    ctypes.memmove(ctypes.addressof(params) + at, tma.encode_bytes(spec, dtype), 128)
    return MapSlot(offset=at, index=index, spec=spec, dtype=dtype, address=spec.address,
                   address_offset=tma.address_offset(spec, dtype))


def point_map(params, slot: MapSlot, address: int) -> None:
    """A descriptor's global address to this call's tensor: one 8-byte write where tma.address_offset proved the
    place, else a full encode (cached by address)."""
    if slot.address_offset is not None:
        POINTER.pack_into(params, slot.offset + slot.address_offset, address)
    else:
        from tuner.serving.launch import tma

        ctypes.memmove(ctypes.addressof(params) + slot.offset,
                       tma.encode_bytes(tma.with_address(slot.spec, address), slot.dtype), 128)
    slot.address = address




def _check_layout(name: str, t) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the head dim must be contiguous (stride 1), got strides {tuple(t.stride())}")
    per_16_bytes = 16 // t.element_size()
    if any(s % per_16_bytes for s in t.stride()[:-1]):
        raise ValueError(f"{name}: batch/sequence/head strides must be multiples of {per_16_bytes} elements (16 bytes: "
                         f"128-bit loads), got {tuple(t.stride())}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")


def _check_inputs(q, k, v, dtype, spec: dict, packed: bool = False, paged: bool = False) -> None:
    """What every kernel needs of q, k, v (4-D, or packed sequences seen as one 'batch' of 4-D; ``paged``:
    k and v are caches of pages, whose count has nothing to do with q's 'batch')."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not hasattr(t, "is_cuda") or not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA torch tensor")
        if t.dtype != dtype:
            raise ValueError(f"{name} is {t.dtype}; this kernel was built for {dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        _check_layout(name, t)
    if q.device != k.device or q.device != v.device:
        raise ValueError("q, k and v must be on the same device")
    b, sq, hq, dq = q.shape
    bk, sk, hkv, dk = k.shape
    if (dq, dk) != (spec["d_qk"], spec["d_qk"]):
        raise ValueError(f"q/k head dim must be {spec['d_qk']}, got {dq}/{dk}")
    if tuple(v.shape) != (bk, sk, hkv, spec["d_v"]):
        raise ValueError(f"v must be {(bk, sk, hkv, spec['d_v'])}, got {tuple(v.shape)}")
    if bk != b and not paged:
        raise ValueError(f"q and k batch differ: {b} vs {bk}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if not packed and (sq < 1 or sk < 1):   # packed: the lengths live in cu_seqlens (0 is a valid total)
        raise ValueError("sequence lengths must be >= 1")
