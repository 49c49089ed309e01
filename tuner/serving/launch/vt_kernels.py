"""The Triton kernels of tuner/serving/launch/transpose_triton.py (imported from there on first use: Triton resolves a
jitted function's callees among its module's globals, and the kernels exist where Triton imports)."""
try:
    import triton
    import triton.language as tl
except ImportError:   # (the CPU build of torch has no Triton: plan.transposed_v copies with torch there)
    triton = None

if triton is not None:
    @triton.jit
    def vt_key(c, ACC: tl.constexpr):
        # the key (from a 16-aligned start) at V^T column c: plan.vt_column's inverse
        if ACC:
            return c - c % 16 + 8 * ((c >> 1) & 1) + 2 * ((c >> 2) & 3) + (c & 1)
        return c

    @triton.jit
    def transpose_v(src, dst, keys, columns, heads, s_b, s_s, s_h, d_b, d_h, d_d, D: tl.constexpr, T: tl.constexpr,
                    ACC: tl.constexpr):
        # a tile of V^T columns, each read from its key (zeros past the keys, up to the map's extent ``columns``)
        pid_c, pid_d, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b = pid_bh // heads
        h = pid_bh % heads
        c = pid_c * T + tl.arange(0, T)
        s = vt_key(c, ACC)
        d = pid_d * T + tl.arange(0, T)
        tile = tl.load(src + b.to(tl.int64) * s_b + s[:, None].to(tl.int64) * s_s + h * s_h + d[None, :],
                       mask=(s[:, None] < keys) & (d[None, :] < D), other=0)
        out = dst + b.to(tl.int64) * d_b + h.to(tl.int64) * d_h + d[None, :].to(tl.int64) * d_d + c[:, None]
        tl.store(out, tile, mask=(c[:, None] < columns) & (d[None, :] < D))

    @triton.jit
    def transpose_packed_v(src, dst, cu, batch, keys_t, s_s, s_h, d_h, d_d, D: tl.constexpr, T: tl.constexpr,
                           A: tl.constexpr, STEPS: tl.constexpr, ACC: tl.constexpr):
        # a tile of V^T columns: each column's sequence (sequence_of_column), its key, or a zero in a gap
        pid_c, pid_d, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        c = pid_c * T + tl.arange(0, T)
        d = pid_d * T + tl.arange(0, T)
        seq, first, column0 = sequence_of_column(c, cu, batch, A, STEPS)
        key = first + vt_key(c - column0, ACC)
        valid = (key >= first) & (key < tl.load(cu + seq + 1))
        tile = tl.load(src + key[:, None].to(tl.int64) * s_s + h * s_h + d[None, :],
                       mask=valid[:, None] & (d[None, :] < D), other=0)
        out = dst + h.to(tl.int64) * d_h + d[None, :].to(tl.int64) * d_d + c[:, None]
        tl.store(out, tile, mask=(c[:, None] < keys_t) & (d[None, :] < D))

    @triton.jit
    def sequence_of_column(c, cu, batch, A: tl.constexpr, STEPS: tl.constexpr):
        # sequence b's columns start at A x ceil(cu[b] / A) + A x b (strictly increasing in b): a binary search finds
        # a column's sequence; -> (sequence, its first key, its first column)
        lo = tl.zeros_like(c)
        hi = tl.zeros_like(c) + batch
        for _ in tl.static_range(STEPS):
            mid = (lo + hi) // 2
            go = hi - lo > 1
            at = (tl.load(cu + mid, mask=go, other=0) + A - 1) // A * A + A * mid
            lo = tl.where(go & (at <= c), mid, lo)
            hi = tl.where(go & (at > c), mid, hi)
        first = tl.load(cu + lo)
        return lo, first, (first + A - 1) // A * A + A * lo

    # (no specialisation on the shapes: one build for every call; a build specialised on a page-256 call's strides
    # failed in Triton's layout pass on an H200)
    @triton.jit(do_not_specialize=["batch", "page_size", "t_b", "s_p", "s_r", "s_h"])
    def transpose_paged_v(src, dst, table, cu, batch, keys_t, page_size, t_b, s_p, s_r, s_h, d_h, d_d,
                          D: tl.constexpr, T: tl.constexpr, A: tl.constexpr, STEPS: tl.constexpr, ACC: tl.constexpr,
                          PAST: tl.constexpr):
        # T columns of V^T (every d), each read through the page table from its sequence's key (zeros where none),
        # up to PAST columns after the last sequence's last key: the kernel reads no further, so a tile past that
        # returns at once (the width is batch x the most keys a sequence can have; a skewed batch's is mostly past)
        pid_c, h = tl.program_id(0), tl.program_id(1)
        limit = tl.load(cu + batch) + A * (batch + 1) + PAST
        if pid_c * T < limit:
            # the columns as a (T, 1) tensor from the start: one layout for the search, the keys and the tile (with
            # (T,) vectors broadcast later, Triton 3.6's layout pass failed on some search depths and key orders)
            c = pid_c * T + tl.arange(0, T)[:, None]
            written = (c < keys_t) & (c < limit)
            seq, first, column0 = sequence_of_column(c, cu, batch, A, STEPS)
            key = vt_key(c - column0, ACC)
            valid = written & (key >= 0) & (key < tl.load(cu + seq + 1) - first)
            key = tl.where(valid, key, 0)
            page = tl.load(table + seq.to(tl.int64) * t_b + key // page_size, mask=valid, other=0)
            # (V's strides are not specialised: its rows' 16-byte alignment, d a multiple of 16 and rows contiguous, is
            # stated, for 16-byte loads instead of one byte each)
            row = tl.multiple_of(page.to(tl.int64) * s_p + (key % page_size).to(tl.int64) * s_r + h * s_h, [16, 16])
            vt_row = dst + h.to(tl.int64) * d_h
            for d0 in tl.static_range(0, D, T):
                d = d0 + tl.arange(0, T)[None, :]
                # (d < D: the last T columns of a head dim T does not divide, 96, end at D, else the load reads the
                # next head's row and the store writes the next head's V^T rows; a constant bound, a multiple of 32:
                # the mask is uniform over 16-byte groups, which keep their vector moves)
                in_d = d < D
                tile = tl.load(src + row + d, mask=valid & in_d, other=0)
                # the whole tile up to V^T's width: columns past ``limit`` in it are zeros, read by no kernel
                out = vt_row + d.to(tl.int64) * d_d + c
                tl.store(out, tile, mask=(c < keys_t) & in_d)
