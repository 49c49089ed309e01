"""The geometry of global->shared copies, shared by the parameter checks and the emitters."""


def copy_row_threads(width: int) -> int:
    """Threads that copy one row of a ``width``-wide tile with 16-byte (8-element) copies: the global->shared
    copies tile rows in 64-wide chunks (32-wide where the width is not a multiple of 64). One copy step of
    ``threads`` threads covers threads / this many rows (emitters._gmem_copy builds exactly that layout)."""
    return (64 if width % 64 == 0 else 32) // 8
