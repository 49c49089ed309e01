"""The swizzle of a 16-bit shared tile of the Hopper kernels: which GMMA shared-memory atom its rows take, and so the
columns of its TMA boxes, its stmatrix blocks and its descriptors' layout type.

A row of 64 columns (128 bytes) takes the 128-byte swizzle. A head dim that 64 does not divide (96: 192 bytes a row)
takes 32-column atoms of the 64-byte swizzle and three boxes a row, as FlashAttention-3's shared-memory selector picks the
widest swizzle that divides the row.
"""
from __future__ import annotations

from translate.kernel import TranslationError

ATOMS = ((64, "SW128"), (32, "SW64"), (16, "SW32"))   # 16-bit elements per atom row, CuTe's name of its swizzle
LAYOUT_TYPE = {64: 1, 32: 2, 16: 3}   # 16-bit elements per atom row -> GMMA descriptor layout type (B128, B64, B32)


def atom_width(width: int) -> int:
    """The columns of the widest GMMA swizzle atom (16-bit: 64, 32 or 16) that divides a row of ``width`` elements."""
    for elems, _ in ATOMS:
        if width % elems == 0:
            return elems
    raise TranslationError(f"a {width}-element row is not a multiple of 16 (GMMA shared-memory layouts)")


def chunk(width: int) -> int:
    """The columns of a Q/K/V/O tile's TMA box, swizzle atom and store block: 64 (128-byte swizzle) where they divide
    the row, else 32 (64-byte swizzle; translate/params_sm90.py keeps head dims multiples of 32)."""
    return 64 if width % 64 == 0 else 32


def k_major_atom(width: int) -> str:
    """The GMMA shared-memory atom of a K-major tile of ``width``-element rows: the widest swizzle that divides it."""
    return f"GMMA::Layout_K_{dict(ATOMS)[atom_width(width)]}_Atom<Element>"


def mn_major_atom(width: int) -> str:
    """The MN-major atom of a tile read across ``width``-element rows (V as (d_v, keys)): the rows' swizzle."""
    return f"GMMA::Layout_MN_{dict(ATOMS)[atom_width(width)]}_Atom<Element>"
