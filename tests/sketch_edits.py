"""Edits of reference sketches shared by the schedule tests."""


def moved_prefetch(text: str) -> str:
    """The same program with the prefetch of K(i+1) (the `if i < N - 1 ... end` block) moved after the
    second GEMM: the statement order is the schedule, so the kernel must change with it."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("if i < N - 1"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "end")
    block, rest = lines[start:end + 1], lines[:start] + lines[end + 1:]
    at = next(i for i, ln in enumerate(rest) if "accumulate O_register" in ln)
    return "\n".join(rest[:at + 1] + block + rest[at + 1:]) + "\n"
