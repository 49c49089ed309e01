"""The runtime's launch ABI on the CPU: the cubin architecture check on real nvcc output, and the parameter
buffer a launch hands the driver, argument by argument, for a real generated Hopper kernel (fake tensors,
a fake TMA encoder): what the GPU tests can only see as a right or wrong answer."""
import math
import struct
import subprocess

import pytest
import torch

import ctypes

from tuner.serving.launch import driver as cuda, kernel as attention, plan as launch_plan, tma


@pytest.mark.parametrize("arch,sm", [("sm_80", (8, 0)), ("sm_90a", (9, 0)), ("sm_75", (7, 5)), ("sm_89", (8, 9))])
def test_cubin_arch_reads_what_nvcc_wrote(tmp_path, arch, sm):
    from translate import nvcc

    try:
        exe = nvcc.find_nvcc()
    except nvcc.ToolNotFound as exc:
        pytest.skip(str(exc))
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n')
    compute = arch.replace("sm_", "compute_")
    subprocess.run([str(exe), "-cubin", f"-gencode=arch={compute},code={arch}", "-o", str(tmp_path / "k.cubin"),
                    str(src)], check=True, capture_output=True)
    assert cuda.cubin_arch((tmp_path / "k.cubin").read_bytes()) == sm


def test_ptx_and_junk_have_no_cubin_arch():
    assert cuda.cubin_arch(b"//\n.version 8.0\n.target sm_90a\n") is None
    assert cuda.cubin_arch(b"\x7fELF" + bytes(60)) is None           # an ELF, not a CUDA one


def test_which_gpus_a_cubin_runs_on():
    assert cuda.runs_on((9, 0), (9, 0)) and cuda.runs_on((8, 0), (8, 9))
    assert not cuda.runs_on((8, 0), (9, 0)) and not cuda.runs_on((9, 0), (8, 0))
    assert not cuda.runs_on((8, 6), (8, 0))


class FakeTensor:
    """Just what a launch plan reads of a CUDA tensor."""

    def __init__(self, shape, address, strides=None, dtype=torch.bfloat16):
        self.shape = torch.Size(shape)
        self._strides = strides or tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        self.address, self.dtype, self.is_cuda = address, dtype, True
        self.device = torch.device("cuda", 0)

    def stride(self, axis=None):
        return self._strides if axis is None else self._strides[axis]

    def dim(self):
        return len(self.shape)

    def data_ptr(self):
        return self.address

    def element_size(self):
        return self.dtype.itemsize


def _fake_encoding(spec, dtype):
    """A made-up 128-byte descriptor: seven geometry words, then the address at byte 56."""
    words = [*spec.dims, *spec.strides_bytes, spec.address, *spec.box, spec.element_bytes, len(dtype)]
    return struct.pack("<16Q", *(words + [0] * (16 - len(words))))


@pytest.fixture
def hopper_kernel():
    import tl
    import translate
    from hardware_profiles import load_profile
    from translate.defaults import default_params
    from kernel_abi.spec import KernelSpec

    from tuner.build import resolve_schedule

    profile = load_profile("h100")
    spec = KernelSpec("gqa", 128, 128, True, "bf16")
    program = tl.parse_program(tl.load_sketch(spec.variant, spec.causal, resolve_schedule(None, profile)))
    gen = translate.generate(program, default_params(profile, spec, "ws_overlap"), profile, spec)
    return attention.AttentionKernel(meta=gen.meta(), device_index=0, _module=None, _function=None, _sm_count=132)


def test_the_parameter_buffer_holds_every_argument_in_the_kernels_order(hopper_kernel, monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    monkeypatch.setattr(attention.AttentionKernel, "_tile_counter", lambda self, stream: 0xC0FFEE00)
    b, sq, sk, hq, hkv = 2, 1000, 1500, 16, 4
    # q a strided view (packed projection), k/v contiguous
    q = FakeTensor((b, sq, hq, 128), 0x1000_0000, strides=(sq * 3 * hq * 128, 3 * hq * 128, 128, 1))
    k = FakeTensor((b, sk, hkv, 128), 0x2000_0000)
    v = FakeTensor((b, sk, hkv, 128), 0x3000_0000)
    plan = launch_plan.build_plan(hopper_kernel, q, k, v, None, 0.1)
    meta = hopper_kernel.meta
    tiles = -(-sq // meta["block_m"]) * hq * b
    assert plan.grid == ((min(tiles, 132) if meta["grid"] == "persistent" else tiles), 1, 1)
    assert plan.out_shape == (b, sq, hq, 128)
    o_address = 0x4000_0000
    hopper_kernel._pack(plan, (q.address, k.address, v.address, o_address), stream_handle=7)
    o_strides = (sq * hq * 128, hq * 128, 128)
    want = {"q": q.address, "k": k.address, "v": v.address, "o": o_address, "seqlen_q": sq, "seqlen_k": sk,
            "group": hq // hkv, "heads_q": hq, "batch": b, "tile_counter": 0xC0FFEE00,
            "softmax_scale_log2": struct.unpack("<f", struct.pack("<f", 0.1 * math.log2(math.e)))[0]}
    for name, t in (("q", q), ("k", k), ("v", v)):
        for axis, what in enumerate(("batch", "row", "head")):
            want[f"{name}_{what}_stride"] = t.stride(axis)
    for axis, what in enumerate(("batch", "row", "head")):
        want[f"o_{what}_stride"] = o_strides[axis]
    base = ctypes.addressof(plan.params)
    raw = bytes(plan.params)
    seen = []
    for i, (name, kind) in enumerate(attention.AttentionKernel.args.fget(hopper_kernel)):
        at = plan.pointers[i] - base
        if kind.startswith("tensormap:"):
            tensor = kind.split(":")[1]
            address = {"q": q.address, "k": k.address, "v": v.address, "o": o_address}[tensor]
            words = struct.unpack_from("<16Q", raw, at)
            assert words[7] == address, name                          # patched in place at the proven offset
            rows = meta["tensor_maps"][tensor]["rows"]
            assert words[8:12] == (64, rows, 1, 1), name
        else:
            fmt = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}[kind]
            assert struct.unpack_from(fmt, raw, at)[0] == want[name], name
        seen.append(name)
    assert {"q", "o", "softmax_scale_log2", "tile_counter", "tma_q", "tma_o"} <= set(seen)
    assert meta["grid"] == "persistent" and len(plan.maps) == 4
    assert all(slot.address_offset == 56 for slot in plan.maps)      # 7 geometry words, then the address


def test_a_plan_refuses_what_the_kernel_cannot_take(hopper_kernel, monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    q = FakeTensor((1, 64, 4, 128), 0x1000_0000)
    k = FakeTensor((1, 64, 4, 128), 0x2000_0000)
    with pytest.raises(ValueError, match="multiples of 8"):
        launch_plan.build_plan(hopper_kernel, FakeTensor((1, 64, 4, 128), 0x1000_0000, strides=(64 * 4 * 132, 4 * 132, 132, 1)),
                            k, k, None, None)
    for scale in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive finite"):
            launch_plan.build_plan(hopper_kernel, q, k, k, None, scale)
    with pytest.raises(ValueError, match="head dim must be 128"):
        launch_plan.build_plan(hopper_kernel, FakeTensor((1, 64, 4, 64), 0x1000_0000), FakeTensor((1, 64, 4, 64), 0x2000_0000),
                            FakeTensor((1, 64, 4, 64), 0x3000_0000), None, None)


def test_an_abi_1_kernel_takes_only_its_compiled_scale(hopper_kernel, monkeypatch):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    meta = dict(hopper_kernel.meta, abi=1, args=[a for a in hopper_kernel.meta["args"] if a[0] != "softmax_scale_log2"])
    old = attention.AttentionKernel(meta=meta, device_index=0, _module=None, _function=None, _sm_count=132)
    q = FakeTensor((1, 64, 4, 128), 0x1000_0000)
    launch_plan.build_plan(old, q, q, q, None, 1 / math.sqrt(128))
    with pytest.raises(ValueError, match="ABI 1"):
        launch_plan.build_plan(old, q, q, q, None, 0.2)


def _packed(kernel):
    """The fixture's GQA kernel as if built with pack_gqa (its Q and O maps heads first)."""
    maps = {t: dict(box, **({"heads_first": True} if t in "qo" else {})) for t, box in kernel.meta["tensor_maps"].items()}
    return attention.AttentionKernel(meta=dict(kernel.meta, tensor_maps=maps), device_index=0, _module=None,
                                   _function=None, _sm_count=132)


@pytest.mark.parametrize("grid", ["persistent", "tiles"])
def test_a_packed_heads_plan_sizes_the_grid_by_kv_heads_and_maps_heads_first(hopper_kernel, monkeypatch, grid):
    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    packed = _packed(hopper_kernel)
    packed.meta["grid"] = grid
    b, sq, hq, hkv = 3, 1000, 16, 2                      # group 8: a 128-row tile is 16 tokens of 8 heads
    q = FakeTensor((b, sq, hq, 128), 0x1000_0000)
    k = FakeTensor((b, 1200, hkv, 128), 0x2000_0000)
    plan = launch_plan.build_plan(packed, q, k, k, None, None)
    tiles = -(-sq // (packed.meta["block_m"] // 8)) * hkv * b
    assert plan.grid == ((min(tiles, 132) if grid == "persistent" else tiles), 1, 1)
    by_tensor = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert by_tensor["q"].box == (64, 8, packed.meta["block_m"] // 8, 1) and by_tensor["q"].dims == (128, hq, sq, b)
    assert by_tensor["o"].box == (64, 8, 64 // 8, 1)
    assert by_tensor["k"].box == (64, packed.meta["block_n"], 1, 1)   # K and V: one KV head a box, as always


def test_a_packed_heads_kernel_runs_a_group_that_does_not_divide_64_one_head_a_tile(hopper_kernel, monkeypatch):
    """Group 3 (6/2; Qwen2's 28/4 is 7): its tokens cannot fill a warpgroup's 64 rows, so the launch passes pack 1
    and the same kernel walks one query head a tile, its maps heads first with one head a box."""

    monkeypatch.setattr(tma, "encode_bytes", _fake_encoding)
    monkeypatch.setattr(tma, "_offsets", {})
    packed = _packed(hopper_kernel)
    q, k = FakeTensor((1, 1000, 6, 128), 0x1000_0000), FakeTensor((1, 1000, 2, 128), 0x2000_0000)
    plan = launch_plan.build_plan(packed, q, k, k, None, None)
    assert plan.grid == launch_plan.build_plan(hopper_kernel, q, k, k, None, None).grid   # as many tiles as unpacked
    by_tensor = {"qkvo"[slot.index]: slot.spec for slot in plan.maps}
    assert by_tensor["q"].box == (64, 1, packed.meta["block_m"], 1) and by_tensor["q"].dims == (128, 6, 1000, 1)
    assert launch_plan.heads_per_tile(packed.meta, 3) == 1 and launch_plan.heads_per_tile(packed.meta, 8) == 8
    assert launch_plan.heads_per_tile(hopper_kernel.meta, 8) == 1


def test_the_descriptor_address_offset_is_proven_not_assumed():
    spec = tma.tensor_map_spec(0x1000, (1, 64, 4, 128), (64 * 4 * 128, 4 * 128, 128, 1), 2, rows=64)
    assert tma.address_offset(spec, "bf16", encode=_fake_encoding) == 56

    def shifted(spec, dtype):                 # an encoder that stores address >> 4: no plain word to patch
        data = bytearray(_fake_encoding(spec, dtype))
        struct.pack_into("<Q", data, 56, spec.address >> 4)
        return bytes(data)

    tma._offsets.clear()
    assert tma.address_offset(spec, "bf16", encode=shifted) is None
    tma._offsets.clear()


def test_check_meta_names_what_is_missing():
    with pytest.raises(cuda.KernelLoadError, match="ABI 7"):
        attention.check_meta({"abi": 7})
    with pytest.raises(cuda.KernelLoadError, match="lacks 'smem_bytes'"):
        attention.check_meta({"abi": 2, "name": "k", "num_threads": 128, "block_m": 64, "spec": {}})


def test_tile_counters_come_from_blocks_reserved_outside_captures(hopper_kernel, monkeypatch):
    """One counter per stream, from blocks allocated outside CUDA-graph captures: a capture on a new stream takes
    a reserved one (never allocates: torch.compile's CUDA graphs refuse an allocation that outlives the capture),
    the reserve is refilled outside captures, and a capture that finds none left says what to do."""
    blocks = []

    def reserve(self):
        base = 0x7000_0000 + 0x1000 * len(blocks)
        blocks.append(base)
        self._free_counters.extend(base + 8 * i for i in reversed(range(attention.COUNTER_BLOCK)))

    capturing = [False]
    monkeypatch.setattr(attention.AttentionKernel, "reserve_counters", reserve)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    kernel = hopper_kernel
    first = kernel._tile_counter(1)
    assert first == blocks[0] and len(blocks) == 1
    taken = {first} | {kernel._tile_counter(stream) for stream in range(2, attention.COUNTER_BLOCK - attention.COUNTER_SPARE + 1)}
    assert len(taken) == attention.COUNTER_BLOCK - attention.COUNTER_SPARE         # distinct, 8 bytes apart in one block
    assert taken == {blocks[0] + 8 * i for i in range(len(taken))}
    kernel._tile_counter(1000)                      # below the spare: a second block, outside the capture
    assert len(blocks) == 2
    capturing[0] = True
    for stream in range(2000, 2000 + len(kernel._free_counters)):
        kernel._tile_counter(stream)                # captures take reserved counters and allocate nothing
    assert len(blocks) == 2 and not kernel._free_counters
    with pytest.raises(cuda.KernelLaunchError, match="while a CUDA graph is captured"):
        kernel._tile_counter(9999)
    capturing[0] = False
    assert kernel._tile_counter(9999) and len(blocks) == 3
