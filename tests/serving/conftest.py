"""An exported folder of structurally real configs, served on the CPU by a stand-in kernel: every path of
the custom op, the entry points and the transformers integration runs without a GPU."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

H100 = "NVIDIA H100 80GB HBM3"


class StandInKernel:
    """What tuner.serving.launch.load_kernel returns, computed on the CPU in fp32: the kernel's contract (q, k, v
    in (b, s, h, d), bottom-right causal from its spec, any positive scale) and its refusals."""

    def __init__(self, meta: dict):
        self.meta = meta
        self.calls = 0
        self.seen = []      # (window, softcap, sinks given) of each call
        self.leftpads = []  # the cache_leftpad of each call (None: none)

    def _options(self, q, window_size, softcap, sinks, heads_q):
        """The options of a call, refused as tuner.serving.launch.plan.option_values refuses them: an option the
        kernel was not built with, a cap or sinks it was built with and the call lacks, sinks not fp32 (hq,)."""
        from tuner.serving.options import ModelOptions

        spec = self.meta.get("spec", {})
        window = tuple(window_size or (-1, -1))
        local = window[0] >= 0 or (window[1] >= 0 and not spec.get("causal"))
        for option, given in (("local", local), ("softcap", bool(softcap)), ("sinks", sinks is not None)):
            if given and not spec.get(option):
                raise ValueError(f"built without {option}")
            if spec.get(option) and not given and option != "local":
                raise ValueError(f"built with {option}: the call must give it")
        if sinks is not None and (sinks.dtype != torch.float32 or tuple(sinks.shape) != (heads_q,)):
            raise ValueError("sinks must be fp32 (heads_q,)")
        self.seen.append((window, softcap, sinks is not None))
        return ModelOptions(window, float(softcap or 0.0), sinks)

    def __call__(self, q, k, v, out=None, softmax_scale=None, *, window_size=(-1, -1), softcap=0.0, sinks=None):
        from tuner.serving.options import reference_attention

        spec = self.meta.get("spec", {"causal": self.meta.get("causal", True)})
        if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("the head dim must be contiguous")
        options = self._options(q, window_size, softcap, sinks, q.shape[2])
        self.calls += 1
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
        return reference_attention(q.float(), k.float(), v.float(), spec["causal"], scale, options).to(q.dtype)

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None, out=None,
               softmax_scale=None, *, window_size=(-1, -1), softcap=0.0, sinks=None):
        from tuner.serving.options import reference_varlen

        spec = self.meta["spec"]
        if spec.get("layout") != "varlen":
            raise ValueError("not a varlen kernel")
        options = self._options(q, window_size, softcap, sinks, q.shape[1])
        self.calls += 1
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
        return reference_varlen(q.float(), k.float(), v.float(), cu_seqlens_q, cu_seqlens_k, seqused_k,
                                spec["causal"], scale, options).to(q.dtype)

    def paged(self, q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, max_seqlen_q, out=None,
              softmax_scale=None, *, window_size=(-1, -1), softcap=0.0, sinks=None):
        """tuner.serving.launch.kernel.AttentionKernel.paged's contract and refusals (tuner/serving/launch/plan.py build_paged_plan:
        the layout, seqused_k, an int32 table of one row a sequence, a page size that tiles block N)."""
        from tuner.serving.paged_sdpa import paged_sdpa

        spec = self.meta["spec"]
        if spec.get("layout") != "paged":
            raise ValueError("not a paged kernel")
        if seqused_k is None:
            raise ValueError("a paged call needs seqused_k")
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != cu_seqlens_q.shape[0] - 1:
            raise ValueError("page_table must be int32 (batch, pages)")
        page, block_n = int(k_cache.shape[1]), int(self.meta.get("block_n", self.meta["params"]["block_n"]))
        if page % block_n and block_n % page:
            raise ValueError(f"page size {page} must divide block N {block_n} or be a multiple of it")
        options = self._options(q, window_size, softcap, sinks, q.shape[1])
        self.calls += 1
        if options.any:
            from tuner.serving.options import reference_paged

            scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
            return reference_paged(q.float(), k_cache.float(), v_cache.float(), cu_seqlens_q, seqused_k, page_table,
                                   spec["causal"], scale, options).to(q.dtype)
        res = paged_sdpa(q.float(), k_cache.float(), v_cache.float(), cu_seqlens_q, seqused_k, page_table,
                         spec["causal"], softmax_scale)
        return res.to(q.dtype)


class StandInDecodeKernel:
    """What tuner.serving.launch.decode_kernel.load_decode_kernel returns, computed on the CPU in fp32 by the reference: the
    kernel's call (flash_attn_with_kvcache's arguments, causal from its spec) and its refusals
    (check_decode_inputs: 1..16 query tokens, its dtype, a table for a paged kernel and none for a dense one,
    lengths for a paged call, a power-of-two page size, int32 lengths, a contiguous head dim)."""

    def __init__(self, meta: dict):
        self.meta = meta
        self.splits = []
        self.seen = []      # (window, softcap, sinks given) of each call
        self.leftpads = []  # the cache_leftpad of each call (None: none)

    def __call__(self, q, k_cache, v_cache, cache_seqlens=None, page_table=None, softmax_scale=None,
                 num_splits=None, return_lse=False, out=None, workspace=None, window_size=(-1, -1), softcap=0.0,
                 learnable_sink=None, cache_leftpad=None, k_scale=None, v_scale=None):
        from kernel_abi.spec import FEATURES
        from tuner.serving.decode_sdpa import decode_reference
        from tuner.serving.launch.decode_kernel import option_errors
        from tuner.serving.options import ModelOptions

        spec = self.meta["spec"]
        if self.meta.get("grid") != "decode":
            raise ValueError("not a decode kernel")
        errors = option_errors(tuple(f for f in FEATURES if spec.get(f)), window_size, softcap, learnable_sink,
                               q.shape[2], q.device)
        if errors:      # the launcher's own refusal of options the kernel lacks
            raise ValueError("; ".join(errors))
        self.seen.append((tuple(window_size), softcap, learnable_sink is not None))
        if not 1 <= q.shape[1] <= 16:
            raise ValueError(f"a decode kernel takes 1..16 query tokens per sequence, got {q.shape[1]}")
        if q.dtype != {"bf16": torch.bfloat16, "fp16": torch.float16}[spec["dtype"]]:
            raise ValueError(f"q is {q.dtype}; this kernel was built for {spec['dtype']}")
        if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
            raise ValueError("the head dim must be contiguous")
        if spec["layout"] == "paged":
            if page_table is None or cache_seqlens is None:
                raise ValueError("this decode kernel reads a paged cache: pass page_table and cache_seqlens")
            if k_cache.shape[1] & (k_cache.shape[1] - 1):
                raise ValueError(f"page size {k_cache.shape[1]} must be a power of two")
        elif page_table is not None:
            raise ValueError("this decode kernel reads a dense cache")
        if cache_seqlens is not None and (cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (q.shape[0],)):
            raise ValueError("cache_seqlens must be a contiguous int32 tensor of b lengths")
        if cache_leftpad is not None and (spec["layout"] == "paged" or cache_leftpad.dtype != torch.int32):
            raise ValueError("cache_leftpad: a dense cache's int32 rows only")
        fp8 = spec.get("kv_dtype") == "fp8"   # the launcher's checks of an FP8 cache kernel (decode_kernel.py)
        if fp8 != (k_scale is not None or v_scale is not None):
            raise ValueError("k_scale/v_scale go with an FP8 cache kernel, which needs both")
        if fp8 and (k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != torch.float8_e4m3fn):
            raise ValueError("this kernel reads an e4m3 cache")
        self.splits.append(num_splits)
        self.leftpads.append(cache_leftpad)
        o, lse = decode_reference(q.float(), k_cache if fp8 else k_cache.float(), v_cache if fp8 else v_cache.float(),
                                  cache_seqlens, page_table, spec["causal"], softmax_scale,
                                  ModelOptions(tuple(window_size), float(softcap), learnable_sink), cache_leftpad,
                                  (k_scale, v_scale) if fp8 else None)
        o = o.to(q.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, lse) if return_lse else o


def stand_in_loader(cubin, meta, device_index):
    return StandInDecodeKernel(meta) if meta.get("grid") == "decode" else StandInKernel(meta)


def serve_records(folder: Path, records, make_kernel=stand_in_loader):
    """``records`` exported for the h100 profile into ``folder`` and served on the CPU (its 'device' an H100) by stand-in
    kernels from ``make_kernel(cubin, meta, device_index)``; ``attn.stand_ins`` lists them in load order."""
    from hardware_profiles import load_profile

    from tuner.serving import DeviceFacts, load_exported
    from tuner.store.export import export_records

    export_records(records, load_profile("h100"), folder)
    kernels = []

    def loader(cubin, meta, device_index):
        kernels.append(make_kernel(cubin, meta, device_index))
        return kernels[-1]

    attn = load_exported(folder, devices={("cpu", None): DeviceFacts(H100, (9, 0))}, kernel_loader=loader)
    attn.stand_ins = kernels
    return attn


def reference(q, k, v, causal, scale=None, mask=None):
    """softmax(Q K^T * scale) V in float64, loops over heads, bottom-right causal; empty rows are 0."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, sq, hq, v.shape[3], dtype=torch.float64)
    for h in range(hq):
        kh = h // (hq // hkv)
        s = q[:, :, h].double() @ k[:, :, kh].double().transpose(1, 2) * scale
        if causal:
            keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
            s = s.masked_fill(~keep, float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[:, :, h] = p @ v[:, :, kh].double()
    return out


def make_export(folder: Path, records=None) -> Path:
    from hardware_profiles import load_profile
    from store_fakes import make_record

    from tuner.store.export import export_records

    recs = records or [
        make_record(bucket="s512", cubin=b"mha-512"), make_record(bucket="s4096", cubin=b"mha-4k"),
        make_record(variant="gqa", bucket="s1024", cubin=b"gqa-1k"),
        make_record(variant="gqa", causal=False, bucket="s1024", cubin=b"gqa-nc-1k"),
        make_record(variant="mla", d_qk=192, d_v=128, bucket="s2048", cubin=b"mla-2k"),
        make_record(variant="gqa", bucket="s1024", cubin=b"gqa-varlen-1k", layout="varlen"),
        make_record(variant="gqa", bucket="s8192", cubin=b"gqa-varlen-8k", layout="varlen")]
    for r in recs:   # the stand-in reads the kernel's spec from its meta, as the runtime does
        r.kernel_meta["spec"] = {"causal": r.causal, "d_qk": r.d_qk, "d_v": r.d_v, "dtype": r.dtype,
                                 "layout": r.layout}
    export_records(recs, load_profile("h100"), folder)
    return folder


@pytest.fixture
def exported(tmp_path):
    return make_export(tmp_path / "export")


@pytest.fixture
def served(exported):
    """An ExportedAttention whose CPU 'device' is an H100 and whose kernels are stand-ins."""
    from tuner.serving import DeviceFacts, load_exported

    loads = []

    def loader(cubin, meta, device_index):
        loads.append(cubin)
        return StandInKernel(meta)

    attn = load_exported(exported, devices={("cpu", None): DeviceFacts(H100, (9, 0))}, kernel_loader=loader)
    attn.loads = loads
    return attn


def qkv(b=2, sq=64, sk=None, hq=8, hkv=2, d=128, dv=None, dtype=torch.bfloat16, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    sk = sq if sk is None else sk
    dv = d if dv is None else dv
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hkv, dv, generator=g).to(dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v
