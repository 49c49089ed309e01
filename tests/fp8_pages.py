"""A paged e4m3 cache made from packed rows, shared by the FP8 paged tests (CPU and GPU)."""
import torch


def spread_over_pages(packed, lens, page, gen, spare=5):
    """Packed rows (uint8 bytes of e4m3, (total, heads, d)) spread over the pages of a cache in a shuffled order, spare
    pages and each sequence's last page's tail holding e4m3 NaN bytes (0x7F); the table (int32, batch x most pages)."""
    counts = [-(-n // page) for n in lens]
    cache = torch.full((sum(counts) + spare, page, *packed.shape[1:]), 0x7F, dtype=torch.uint8)
    table = torch.zeros(len(lens), max(1, max(counts)), dtype=torch.int32)
    order = torch.randperm(cache.shape[0], generator=gen).tolist()
    at, row = 0, 0
    for b, (n, c) in enumerate(zip(lens, counts)):
        for j in range(c):
            table[b, j] = order[at]
            rows = min(page, n - j * page)
            cache[order[at], :rows] = packed[row:row + rows]
            at, row = at + 1, row + rows
    return cache, table
