"""TMA descriptors for Hopper kernels, encoded on the host per call and passed by value.

``tensor_map_spec`` is pure (CPU-tested): for a (batch, seqlen, heads, dim) tensor it gives the 4-D map
(dim, seqlen, heads, batch) — innermost first, strides in bytes, a box of 64 columns x ``rows`` with the
128-byte swizzle that matches the kernels' GMMA shared-memory layout (translate/sm90; a kernel whose head dim 64 does
not divide, 96, names boxes of 32 columns, the 64-byte swizzle, in its tensor maps' ``cols``). ``encode`` turns a
spec into a ``CUtensorMap`` with cuda-python's ``cuTensorMapEncodeTiled``; ``TensorMapCache`` keeps the
last few so that re-launching on the same tensors costs a dictionary lookup.

A model's attention gets new tensors (new addresses, same geometry) on every call. Encoding four
descriptors per call through the driver costs more than the launch itself, so ``address_offset`` finds
where an encoded descriptor holds its global address by encoding one geometry at three addresses: when
writing each address into the first encoding at one offset reproduces the driver's other two encodings
byte for byte, a call only writes its addresses there. The format is the driver's and undocumented, so it
is proven per geometry and process, never assumed: no proof means a full encode per new address.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass, replace

BOX_COLUMNS = 64            # 64 16-bit columns = 128 bytes: the SWIZZLE_128B span
MAX_BOX_ROWS = 256


class TensorMapError(ValueError):
    """A tensor the TMA unit cannot address as the kernel needs (alignment, strides, sizes)."""


@dataclass(frozen=True)
class TensorMapSpec:
    dims: tuple[int, int, int, int]          # (dim, seqlen, heads, batch); heads first: (dim, heads, seqlen, batch)
    strides_bytes: tuple[int, int, int]      # of seqlen, heads, batch (heads first: heads, seqlen, batch)
    box: tuple[int, int, int, int]           # (64, rows, 1, 1); heads first: (64, heads, rows / heads, 1)
    element_bytes: int
    address: int
    swizzle_bytes: int = 128                 # the box's row: 128 (64 16-bit or 128 8-bit columns) or 64 bytes


# The swizzles a box's row may span (bytes): 128 and 64 for 16-bit tiles (64 or 32 columns); 32 for an FP8 kernel's
# transposed V whose block N 64 does not divide (FA3's 224 or 160 keys: seven or five 32-byte boxes a row).
SWIZZLE_SPANS = (32, 64, 128)


def tensor_map_spec(address: int, shape, strides, element_bytes: int, rows: int,
                    heads_per_box: int = 0, box_columns: int = BOX_COLUMNS, ragged: bool = False) -> TensorMapSpec:
    """The map of a (batch, seqlen, heads, dim) tensor with element ``strides`` (dim contiguous).
    ``heads_per_box`` > 0 (a kernel that packs the query heads of a KV head into its rows): the map is
    (dim, heads, seqlen, batch) and a box of ``rows`` rows is heads_per_box heads x rows / heads_per_box
    tokens, heads fastest, landing as rows x 128 bytes like any box. ``box_columns``: the box's width (its bytes, 128,
    64 or 32, are the swizzle's span: 64 16-bit columns, 32 at head dim 96, 32 keys of an FP8 V^T of block N 224); ``ragged``: the innermost extent need not be a multiple of it (an FP8 kernel's
    transposed V, (batch, d, heads, keys): the keys past the end read as zeros)."""
    b, s, h, d = (int(x) for x in shape)
    sb, ss, sh, sd = (int(x) for x in strides)
    problems = []
    swizzle = box_columns * element_bytes
    if swizzle not in SWIZZLE_SPANS:
        problems.append(f"a box of {box_columns} columns of {element_bytes} bytes is not a 32-, 64- or 128-byte "
                        "swizzle span")
    if heads_per_box and (rows % heads_per_box or h % heads_per_box):
        problems.append(f"a box of {rows} rows cannot hold whole tokens of {heads_per_box} heads each "
                        f"(of the tensor's {h})")
    if sd != 1:
        problems.append(f"the head dim must be contiguous (stride 1), got {sd}")
    if d % box_columns and not ragged:
        problems.append(f"head dim {d} is not a multiple of {box_columns} (one {swizzle}-byte swizzled box per "
                        f"{box_columns} columns)")
    if not 1 <= rows <= MAX_BOX_ROWS:
        problems.append(f"box rows {rows} must be in 1..{MAX_BOX_ROWS}")
    if address % 16:
        problems.append("the data pointer must be 16-byte aligned")
    strides_bytes = (ss * element_bytes, sh * element_bytes, sb * element_bytes)
    for name, value in zip(("seqlen", "heads", "batch"), strides_bytes):
        if value % 16 or value <= 0 or value >= 1 << 40:
            problems.append(f"the {name} stride ({value} bytes) must be a positive multiple of 16 below 2^40")
    if problems:
        raise TensorMapError("; ".join(problems))
    if heads_per_box:
        return TensorMapSpec((d, h, s, b), (strides_bytes[1], strides_bytes[0], strides_bytes[2]),
                             (box_columns, heads_per_box, rows // heads_per_box, 1), element_bytes, int(address),
                             swizzle)
    return TensorMapSpec((d, s, h, b), strides_bytes, (box_columns, rows, 1, 1), element_bytes, int(address), swizzle)


def encode(spec: TensorMapSpec, dtype: str):
    """A ``CUtensorMap`` for ``spec`` (cuda-python's driver bindings; the GPU machine has them)."""
    try:
        from cuda.bindings import driver
    except ImportError:   # pragma: no cover
        from cuda import cuda as driver
    kind = {"bf16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "fp16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            "fp8": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8}[dtype]   # (bytes: TMA only copies)
    return _encode(driver, spec, kind)


def _encode(driver, spec: TensorMapSpec, data_type):
    u32, u64 = driver.cuuint32_t, driver.cuuint64_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        data_type, 4, spec.address, [u64(x) for x in spec.dims], [u64(x) for x in spec.strides_bytes],
        [u32(x) for x in spec.box], [u32(1)] * 4,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        {128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, 64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
         32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B}[spec.swizzle_bytes],
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if int(err) != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed ({err}) for {spec}")
    return tmap


class TensorMapCache:
    """The last ``size`` encoded maps, keyed by everything that goes into them."""

    def __init__(self, size: int = 64):
        self.size = size
        self._maps: OrderedDict = OrderedDict()

    def get(self, spec: TensorMapSpec, dtype: str):
        key = (spec, dtype)
        found = self._maps.get(key)
        if found is not None:
            self._maps.move_to_end(key)
            return found
        tmap = encode(spec, dtype)
        self._maps[key] = tmap
        if len(self._maps) > self.size:
            self._maps.popitem(last=False)
        return tmap


def with_address(spec: TensorMapSpec, address: int) -> TensorMapSpec:
    return replace(spec, address=int(address))


_cache = TensorMapCache(size=256)


def encode_bytes(spec: TensorMapSpec, dtype: str, encoder=None) -> bytes:
    """The 128 bytes of the descriptor (a process-wide cache of the last encodings)."""
    tmap = (encoder or _cache.get)(spec, dtype)
    return ctypes.string_at(int(tmap.getPtr()), 128)


_PROBE_ADDRESSES = (0x10_0000_0000, 0x23_4567_8400, 0x7F_FFF0_0C00)   # 1024-aligned, within 40 bits
_offsets: dict = {}


def address_offset(spec: TensorMapSpec, dtype: str, encode=None) -> int | None:
    """Where this geometry's encoded descriptor holds its global address (a little-endian 64-bit word at a
    multiple of 8 bytes), proven on three encodings; None when no offset reproduces them."""
    encode = encode or encode_bytes
    geometry = (with_address(spec, 0), dtype)
    if geometry in _offsets:
        return _offsets[geometry]
    found = None
    try:
        encoded = [(a, encode(with_address(spec, a), dtype)) for a in _PROBE_ADDRESSES]
    except TensorMapError:
        encoded = []
    first = encoded[0][1] if encoded else b""
    for offset in range(0, 128, 8):
        if encoded and all(patched(first, offset, a) == data for a, data in encoded):
            found = offset
            break
    _offsets[geometry] = found
    return found


def patched(descriptor: bytes, offset: int, address: int) -> bytes:
    return descriptor[:offset] + int(address).to_bytes(8, "little") + descriptor[offset + 8:]
