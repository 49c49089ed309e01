"""The tile walk of the warp-specialised Hopper kernel, the same in both roles: how many tiles a launch has,
a tile's coordinates and the K tiles it visits, which of those need the mask, and the zeros of a tile that sees
no key. Dense tiles are (query block, head, batch), or with packed query heads (pack_gqa) (query block, head
block, batch): the launch argument ``pack`` is the query heads a tile holds (the group, or 1 where the group does
not divide 64: one head a tile, as unpacked) and rows are token x pack + head; varlen tiles come from the
producer's sequence walk."""
from __future__ import annotations


def tile_grid(pack: bool = False) -> list[str]:
    """The tile count. Packed heads (pack_gqa): a tile is (query block, head block, batch) and holds block_m / pack
    tokens of each of its ``pack`` query heads (the host passes the group when it divides 64, else 1)."""
    if not pack:
        return ["const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;",
                "const int num_tiles = m_blocks * heads_q * batch;  // (query block, head, batch); gridDim.x CTAs walk them",
                "const int section_heads = attn_sm90::l2_section_heads(seqlen_k, kHeadDimQK + kHeadDimV, group, "
                "heads_q * batch);"]
    return ["const int tile_tokens = kBlockM / pack;  // packed heads: row = token x pack + query head of the tile",
            "const int tile_heads = heads_q / pack;  // head blocks: the KV heads (pack = group), or the query heads",
            "const int m_blocks = (seqlen_q + tile_tokens - 1) / tile_tokens;",
            "const int num_tiles = m_blocks * tile_heads * batch;  // (query block, head block, batch); gridDim.x CTAs walk them",
            "const int section_heads = attn_sm90::l2_section_heads(seqlen_k, kHeadDimQK + kHeadDimV, group / pack, "
            "tile_heads * batch);",
            "// head block -> KV head: the identity when packed (pack = group), else / group; a multiply-high a tile where",
            "// a division measured 1.5-2.5% at 512 keys",
            "const cutlass::FastDivmod kv_of_block(group / pack);"]


# Dense tiles: the producer decodes the tile number and leaves (m_block, bidh, bidb) in shared memory beside it
# (tile_slot[1..3], within the 16 bytes the tile number has: translate/sm90/generate.py smem_bytes_ws), so that the
# consumer threads do no division a tile: 2-4 integer divisions, where one measured 1.5-2.5% of a 512-key kernel.
DECODED_COORDS = "tile_slot[1] = m_block; tile_slot[2] = bidh; tile_slot[3] = bidb;  // for the consumers"


def tile_setup(varlen: bool = False, source: str = "", pack: bool = False, decoded: bool = False,
               local: bool = False) -> list[str]:
    """The start of one tile, the same in both roles: its coordinates and the KV tiles it visits. Varlen:
    the sequence's lengths and first rows from ``source`` (an attn_sm90::VarlenTile), which shadow the
    kernel's arguments for this tile (those carry the longest sequence's). ``decoded`` (dense consumers): the
    coordinates the producer decoded (DECODED_COORDS). Packed heads: bidh is the head block, its query heads are
    bidh * pack + (row % pack), and the tile spans tile_tokens tokens. ``local``: the sliding window's bounds
    (window_bounds)."""
    heads, tokens = ("tile_heads", "tile_tokens") if pack else ("heads_q", "kBlockM")
    if varlen:
        coords = [f"const int m_block = {source}.m_block, bidh = {source}.bidh, bidb = 0;  // packed: one 'batch'",
                  f"const int seqlen_q = {source}.seqlen_q, seqlen_k = {source}.seqlen_k;  // this sequence's",
                  f"const int q_row0 = {source}.q_row0, k_row0 = {source}.k_row0;  // its first rows in the packed tensors",
                  "const int causal_offset = seqlen_k - seqlen_q;  // bottom-right within the sequence"]
    elif decoded:
        coords = ["const int m_block = tile_slot[1], bidh = tile_slot[2], bidb = tile_slot[3];  // decoded by the producer"]
    else:
        coords = [f"const attn_sm90::TileCoord coord = attn_sm90::decode_tile(tile, m_blocks, {heads}, section_heads, "
                  f"{heads} * batch, kCausal);",
                  "const int m_block = coord.m_block, bidh = coord.bidh, bidb = coord.bidb;"]
    lines = coords + [
        "const int bidh_kv = kv_of_block.div(bidh);  // the block's KV head" if pack else
        "const int bidh_kv = bidh / group;  // GQA/MQA: KV head = query head // group",
        "int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;  // TL N: KV tiles this query tile visits",
        f"if (kCausal) {{ n_tiles = min(n_tiles, ((m_block + 1) * {tokens} + causal_offset + kBlockN - 1) / kBlockN); }}",
    ]
    if local:
        lines += window_bounds(tokens)
    return lines


def window_bounds(tokens: str) -> list[str]:
    """A local kernel's KV blocks: from the first one holding a key the tile's first row sees (the window's left
    side) to the last one its last row sees (the right side, 0 when causal); the tiles outside are never loaded.
    n_tiles is then the count between them, and KV block = n_block_max - 1 - (tile in iteration order)."""
    return [
        "const int wl = window_left, wr = kCausal ? 0 : window_right;  // the window, keys left and right (-1: open)",
        f"if (wr >= 0) {{ n_tiles = min(n_tiles, ((m_block + 1) * {tokens} + causal_offset + wr + kBlockN - 1) / kBlockN); }}",
        "const int n_block_max = max(0, n_tiles);  // one past the last KV block a row of the tile sees",
        f"const int n_block_min = wl >= 0 ? max(0, (m_block * {tokens} + causal_offset - wl) / kBlockN) : 0;"
        "  // the first",
        "n_tiles = n_block_max - n_block_min;  // TL N: the KV tiles in the window",
    ]


def tile_masking(pack: bool = False, local: bool = False) -> list[str]:
    """Which K tiles of this query tile need the mask (dense layout; iteration order: the last K tile first):
    causal, those from the first holding a key past the tile's first row's diagonal; and a ragged last K tile.
    Counted per tile: a bound from the tile's height alone masked one tile too many at 192 x 128 and 192 x 96
    (d64), and up to two with packed heads. ``local``: window_masking's counts instead."""
    if local:
        return window_masking(pack)
    first_row = "m_block * tile_tokens" if pack else "m_block * kBlockM"
    return [
        f"int n_masked = kCausal ? n_tiles - min(n_tiles, max(0, ({first_row} + causal_offset) / kBlockN)) : 0;",
        "if (n_tiles * kBlockN > seqlen_k) { n_masked = max(n_masked, 1); }  // the ragged last K tile"]


def window_masking(pack: bool = False) -> list[str]:
    """A local kernel's masked K tiles, counted per tile at both ends of its walk: the first ``n_masked`` (the
    highest KV blocks: past the first row's right bound, or the ragged last one) and the last ``n_masked_left``
    (the lowest: before the last row's left bound)."""
    tokens = "tile_tokens" if pack else "kBlockM"
    return [
        f"int n_masked = wr >= 0 ? n_block_max - min(n_block_max, max(0, (m_block * {tokens} + causal_offset + wr) "
        "/ kBlockN)) : 0;",
        "if (n_block_max * kBlockN > seqlen_k) { n_masked = max(n_masked, 1); }  // the ragged last K tile",
        f"const int n_masked_left = wl >= 0 ? max(0, min(n_block_max, ((m_block + 1) * {tokens} - 1 + causal_offset - wl "
        "+ kBlockN - 1) / kBlockN) - n_block_min) : 0;",
    ]


def varlen_masking(local: bool = False) -> list[str]:
    """Which K tiles of a packed sequence's query tile need the mask: a bound from the tile's height and the
    lengths (dense tiles count them exactly: tile_masking); a local kernel's exactly (window_masking)."""
    if local:
        return window_masking()
    return ["const bool tile_aligned = seqlen_k % kBlockN == 0 && (seqlen_k - seqlen_q) % kBlockN == 0 "
            "&& kBlockM % kBlockN == 0;",
            "const int n_masked = kCausal ? (kBlockM + kBlockN - 1) / kBlockN + (tile_aligned ? 0 : 1) "
            ": (seqlen_k % kBlockN != 0 ? 1 : 0);"]


def zero_tile(varlen: bool = False, pack: bool = False) -> list[str]:
    """Causal with seqlen_q > seqlen_k (or no key at all): a query tile that sees no key writes zeros
    (consumer threads)."""
    base_row = "(int64_t(q_row0) + row) * o_row_stride" if varlen else "bidb * o_batch_stride + row * o_row_stride"
    if pack:   # tile row r is token r / pack of query head bidh * pack + r % pack
        rows = ["    const int row = m_block * tile_tokens + idx / row_chunks / pack;",
                "    const int head = bidh * pack + (idx / row_chunks) % pack;"]
        head = "head"
    else:
        rows = ["    const int row = m_block * kBlockM + idx / row_chunks;"]
        head = "bidh"
    return [
        "if (n_tiles <= 0) {  // no key is visible to any row of this query tile -> O rows are 0",
        "  const int row_chunks = kHeadDimV / 8;",
        "  for (int idx = mma_tidx; idx < kBlockM * row_chunks; idx += kConsumerThreads) {",
        *rows,
        "    if (row < seqlen_q) {",
        f"      *reinterpret_cast<cute::uint128_t*>(o_ptr + {base_row} + "
        f"{head} * o_head_stride + (idx % row_chunks) * 8) = cute::uint128_t(0, 0);",
        "    }",
        "  }",
        "  if (mma_tidx % 128 == 0) { attn_sm90::EmptyBarrier::arrive(q_empty); }  // the slot goes back",
        "  ++q_iter;",
        "  continue;",
        "}",
    ]
