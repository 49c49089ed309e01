"""`tune gpus`: the hardware profiles as a table."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from hardware_profiles import ProfileError, load_all_profiles


def show_gpus(console: Console | None = None) -> int:
    # Wide enough for the atom columns even when stdout is not a terminal.
    console = console or Console(width=200)
    try:
        profiles = load_all_profiles()
    except ProfileError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    table = Table(title="Hardware profiles")
    for col in ("GPU", "name", "arch", "SMs", "smem/SM", "smem/block", "regs/SM", "fp16 TF", "bf16 TF",
                "BW GB/s", "fp8", "MMA atoms", "copy atoms (g→s | s→r)"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("name", "copy atoms (g→s | s→r)"))
    for p in profiles:
        table.add_row(
            p.name, p.display_name, f"{p.nvcc_arch} ({p.compute_capability[0]}.{p.compute_capability[1]})",
            str(p.sm_count), f"{p.smem_per_sm_kb} KB", f"{p.smem_per_block_kb} KB", str(p.registers_per_sm),
            f"{p.tflops_fp16:g}", f"{p.tflops_bf16:g}" if p.tflops_bf16 else "–", f"{p.memory_bandwidth_gbs:g}",
            "yes" if p.fp8 else "no", ", ".join(p.mma_atoms),
            ", ".join(p.g2s_copy_atoms) + " | " + ", ".join(p.s2r_copy_atoms),
        )
    console.print(table)
    return 0
