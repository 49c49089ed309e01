"""flash_attn_with_kvcache's k/v append and rotary (tuner/serving/kvcache_append.py) on the CPU: the new rows land
at cache_seqlens in place (dense, and paged across a page boundary through a shuffled table), the attention covers
them, absorbed MLA appends k alone, rotary matches the complex-number rotation at FA2's positions (GPT-J and NeoX
layouts, causal and not), bad arguments are refused before anything is written, and an appending call compiles
without graph breaks."""
import math

import pytest
import torch
from test_decode_serving import close, decode_case, decoded, naive  # noqa: F401 - decoded: the fixture

from tuner.serving.kvcache_append import rotate


def _fresh(lens, s_new, dense, seed, page=16, hkv=2, d=128):
    """A case whose caches have room for s_new more rows (the pages allocated), those rows NaN; new k/v."""
    full = [n + s_new for n in lens]
    q, kc, vc, _, table = decode_case(full, sq=s_new, page=page, hkv=hkv, d=d, dense=dense, seed=seed)
    for i, n in enumerate(lens):
        for r in range(n, n + s_new):
            at = (i, r) if dense else (int(table[i, r // page]), r % page)
            kc[at] = vc[at] = float("nan")
    g = torch.Generator().manual_seed(seed + 100)
    k = torch.randn(len(lens), s_new, hkv, d, generator=g).to(kc.dtype)
    v = torch.randn(len(lens), s_new, hkv, d, generator=g).to(kc.dtype)
    return q, kc, vc, k, v, torch.tensor(lens, dtype=torch.int32), table


def _rows(cache, table, b, rows, page=16):
    if table is None:
        return cache[b, rows]
    return torch.stack([cache[int(table[b, r // page]), r % page] for r in rows])


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("s_new", [1, 3])
def test_new_rows_land_at_the_lengths_and_are_attended(decoded, dense, s_new):
    lens = [15, 30, 0]                                   # 15 + 3 crosses a page of 16; 0: an empty cache
    q, kc, vc, k, v, seqlens, table = _fresh(lens, s_new, dense, seed=s_new)
    before_k, before_v = kc.clone(), vc.clone()
    out = decoded.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, block_table=table, causal=True)
    assert decoded.last_path == "kernel", decoded.last_reason
    assert torch.equal(seqlens, torch.tensor(lens, dtype=torch.int32))   # FA2: the caller advances the lengths
    written = torch.zeros_like(kc, dtype=torch.bool)
    for b, n in enumerate(lens):
        assert torch.equal(_rows(kc, table, b, range(n, n + s_new)), k[b])
        assert torch.equal(_rows(vc, table, b, range(n, n + s_new)), v[b])
        for r in range(n, n + s_new):
            written[(b, r) if dense else (int(table[b, r // 16]), r % 16)] = True
    # nothing else changed (NaN-aware)
    torch.testing.assert_close(kc[~written], before_k[~written], equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(vc[~written], before_v[~written], equal_nan=True, atol=0, rtol=0)
    close(out, naive(q, kc, vc, seqlens + s_new, table, True)[0])


def test_absorbed_mla_appends_k_alone(decoded):
    q, kc, vc, k, _, seqlens, table = _fresh([63, 64], 2, dense=False, seed=9, page=64, hkv=1, d=576)
    q = torch.randn(2, 2, 16, 576, generator=torch.Generator().manual_seed(1)).to(kc.dtype)
    out = decoded.flash_attn_with_kvcache(q, kc, None, k, cache_seqlens=seqlens, block_table=table, causal=True)
    for b, n in enumerate([63, 64]):
        assert torch.equal(_rows(kc, table, b, range(n, n + 2), page=64), k[b])
    close(out, naive(q, kc, kc[..., :512], seqlens + 2, table, True)[0])


def _angles(rows, half, base=10000.0):
    freqs = base ** (-torch.arange(half, dtype=torch.float64) / half)
    return torch.arange(rows, dtype=torch.float64)[:, None] * freqs[None, :]


def _complex_rotation(x, cos, sin, interleaved):
    """x (..., d) times cos + i sin (..., rotary_dim / 2) as complex numbers (pairs or halves), in float64."""
    half = cos.shape[-1]
    head = x[..., :2 * half].double()
    turn = torch.complex(cos.double(), sin.double())
    if interleaved:
        z = torch.view_as_complex(head.reshape(*head.shape[:-1], half, 2).contiguous())
        turned = torch.view_as_real(z * turn).flatten(-2)
    else:
        r = torch.complex(head[..., :half], head[..., half:]) * turn
        turned = torch.cat((r.real, r.imag), dim=-1)
    return torch.cat((turned, x[..., 2 * half:].double()), dim=-1)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_rotary_at_fa2_positions(decoded, interleaved, causal):
    lens, s_new, rotary_dim = [5, 40], 2, 64
    q, kc, vc, k, v, seqlens, table = _fresh(lens, s_new, dense=False, seed=3)
    theta = _angles(64, rotary_dim // 2)
    cos, sin = theta.cos().to(torch.bfloat16), theta.sin().to(torch.bfloat16)
    q0 = q.clone()
    out = decoded.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                          block_table=table, causal=causal, rotary_interleaved=interleaved)
    assert torch.equal(q, q0)                            # the caller's q is not rotated in place
    want_q = torch.empty(q.shape, dtype=torch.float64)
    for b, n in enumerate(lens):
        new_rows = torch.arange(n, n + s_new)
        want_k = _complex_rotation(k[b], cos[new_rows][:, None, :], sin[new_rows][:, None, :], interleaved)
        torch.testing.assert_close(_rows(kc, table, b, new_rows).double(), want_k, atol=2e-2, rtol=1e-2)
        q_rows = new_rows if causal else torch.full((s_new,), n)
        want_q[b] = _complex_rotation(q[b], cos[q_rows][:, None, :], sin[q_rows][:, None, :], interleaved)
    close(out, naive(want_q, kc, vc, seqlens + s_new, table, causal)[0])
    # the columns past rotary_dim pass through unchanged
    assert torch.equal(_rows(kc, table, 1, [40, 41])[..., rotary_dim:], k[1, :, :, rotary_dim:])


def test_rotate_is_identity_at_angle_zero_and_keeps_dtype():
    x = torch.randn(2, 3, 4, 128).to(torch.float16)
    cos, sin = torch.ones(10, 32), torch.zeros(10, 32)
    for interleaved in (True, False):
        got = rotate(x, cos, sin, torch.zeros(2, 3, dtype=torch.long), interleaved)
        assert got.dtype == x.dtype and torch.equal(got, x)


@pytest.mark.parametrize("case,fragment", [
    ("k-only", "k without v"), ("v-only", "v without k"), ("rotary-alone", "need k and v"),
    ("k-shape", r"k must be \(batch, seqlen_new >= 1"), ("k-dtype", "k must be torch.bfloat16"),
    ("rows-differ", "append different numbers of rows"), ("no-lengths", "needs cache_seqlens"),
    ("past-capacity", "whose cache holds 32 rows"), ("padded-entry", "a padded entry"),
    ("negative-length", "negative"), ("rotary-rows", "rotary_cos/rotary_sin have 8 rows"),
    ("rotary-shape", "rotary_dim <= the head dim"), ("rotary-half", "come together"),
    ("lens-device", "cache_seqlens on the cache's device"), ("table-device", "page table on the cache's device"),
])
def test_bad_appends_are_refused_before_anything_is_written(decoded, case, fragment):
    q, kc, vc, k, v, seqlens, table = _fresh([10, 20], 2, dense=False, seed=5)
    kwargs = dict(k=k, v=v, cache_seqlens=seqlens, block_table=table, causal=True)
    cos = sin = torch.zeros(8, 32)
    if case == "k-only":
        kwargs.pop("v")
    elif case == "v-only":
        kwargs.pop("k")
    elif case == "rotary-alone":
        kwargs.pop("k"), kwargs.pop("v")
        kwargs.update(rotary_cos=torch.zeros(64, 32), rotary_sin=torch.zeros(64, 32))
    elif case == "k-shape":
        kwargs["k"] = k[:, :, :1]
    elif case == "k-dtype":
        kwargs["k"] = k.half()
    elif case == "rows-differ":
        kwargs["v"] = v[:, :1]
    elif case == "no-lengths":
        kwargs.pop("cache_seqlens")
    elif case == "past-capacity":
        kwargs["cache_seqlens"] = torch.tensor([10, 31], dtype=torch.int32)       # 2 pages of 16 a sequence
    elif case == "padded-entry":
        kwargs["block_table"] = table.clone()
        kwargs["block_table"][0, 0] = -1
    elif case == "negative-length":
        kwargs["cache_seqlens"] = torch.tensor([-1, 3], dtype=torch.int32)
    elif case == "rotary-rows":
        kwargs.update(rotary_cos=cos, rotary_sin=sin)
    elif case == "rotary-shape":
        kwargs.update(rotary_cos=torch.zeros(64, 65), rotary_sin=torch.zeros(64, 65))
    elif case == "rotary-half":
        kwargs.update(rotary_cos=torch.zeros(64, 32))
    elif case == "lens-device":
        kwargs["cache_seqlens"] = seqlens.to("meta")
    elif case == "table-device":
        kwargs["block_table"] = table.to("meta")
    before_k, before_v, stats = kc.clone(), vc.clone(), dict(decoded.stats)
    with pytest.raises(ValueError, match=fragment):
        decoded.flash_attn_with_kvcache(q, kc, vc, **kwargs)
    assert torch.equal(kc.nan_to_num(7.0), before_k.nan_to_num(7.0)) and torch.equal(vc.nan_to_num(7.0),
                                                                                      before_v.nan_to_num(7.0))
    assert decoded.stats == stats


@pytest.mark.parametrize("case,fragment", [("with-v", "appends k alone"), ("rotary", "last 64")])
def test_absorbed_mla_refusals(decoded, case, fragment):
    q, kc, _, k, _, seqlens, table = _fresh([3], 1, dense=False, seed=2, page=64, hkv=1, d=576)
    kwargs = dict(cache_seqlens=seqlens, block_table=table)
    if case == "with-v":
        kwargs["v"] = k[..., :512]
    else:
        kwargs.update(rotary_cos=torch.zeros(8, 32), rotary_sin=torch.zeros(8, 32))
    with pytest.raises(ValueError, match=fragment):
        decoded.flash_attn_with_kvcache(q[:, :, :1].expand(1, 1, 16, 576), kc, None, k, **kwargs)


def test_an_appending_call_compiles_without_graph_breaks(decoded):
    def step(q, kc, vc, k, v, lens, table, cos, sin):
        out = decoded.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                              block_table=table, causal=True, rotary_interleaved=False)
        return out.float() * 2

    theta = _angles(64, 16)
    cos, sin = theta.cos().float(), theta.sin().float()
    eager_case = _fresh([7, 33], 1, dense=False, seed=8)
    compiled_case = [t.clone() if isinstance(t, torch.Tensor) else t for t in eager_case]
    explained = torch._dynamo.explain(step)(*[t.clone() for t in eager_case], cos, sin)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    want = step(*eager_case, cos, sin)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(*compiled_case, cos, sin)
    torch.testing.assert_close(got, want)
    # the compiled call wrote the rotated rows into its cache as the eager one did
    torch.testing.assert_close(compiled_case[1], eager_case[1], equal_nan=True, atol=0, rtol=0)
    assert math.isfinite(got.abs().max().item())


def test_check_append_false_skips_the_host_read(decoded, monkeypatch):
    import tuner.serving.kvcache_append as ka

    reads = []
    monkeypatch.setattr(ka, "room_errors", lambda *a, **k: reads.append(1) or [])
    q, kc, vc, k, v, seqlens, table = _fresh([10, 20], 1, dense=False, seed=6)
    decoded.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, block_table=table, check_append=False)
    assert reads == []
    decoded.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, block_table=table)
    assert reads == [1]


def test_a_cache_that_does_not_flatten_is_written_in_place(decoded):
    """A dense cache viewed out of a longer buffer (its rows do not flatten into one dimension): the rows still
    land in the caller's storage."""
    q, kc, vc, k, v, seqlens, _ = _fresh([4, 9], 2, dense=True, seed=12)
    big_k = torch.full((2, kc.shape[1] + 5, *kc.shape[2:]), float("nan"), dtype=kc.dtype)
    big_v = big_k.clone()
    big_k[:, :kc.shape[1]], big_v[:, :kc.shape[1]] = kc, vc
    kv, vv = big_k[:, :kc.shape[1]], big_v[:, :kc.shape[1]]
    out = decoded.flash_attn_with_kvcache(q, kv, vv, k, v, cache_seqlens=seqlens, causal=True)
    for b, n in enumerate([4, 9]):
        assert torch.equal(big_k[b, n:n + 2], k[b]) and torch.equal(big_v[b, n:n + 2], v[b])
    close(out, naive(q, kv, vv, seqlens + 2, None, True)[0])
