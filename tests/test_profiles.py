"""Hardware profiles: the six GPUs load, facts match the design card, broken files are clear errors."""
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hardware_profiles as hp
from tuner.commands.cli import app


def test_six_profiles_with_design_card_facts():
    profiles = {p.name: p for p in hp.load_all_profiles()}
    assert set(profiles) == {"t4", "rtx8000", "a100", "l40s", "h100", "h200"}
    facts = {  # name: (sm, SMs, fp16 TFLOPS, GB/s, smem/SM KB, smem/block KB)
        "t4": (75, 40, 65, 320, 64, 64), "rtx8000": (75, 72, 130, 672, 64, 64),
        "a100": (80, 108, 312, 2039, 164, 163), "l40s": (89, 142, 362, 864, 100, 99),
        "h100": (90, 132, 989, 3350, 228, 227), "h200": (90, 132, 989, 4800, 228, 227),
    }
    for name, (sm, sms, tf, bw, smem_sm, smem_block) in facts.items():
        p = profiles[name]
        assert (p.sm, p.sm_count, p.tflops_fp16, p.memory_bandwidth_gbs, p.smem_per_sm_kb,
                p.smem_per_block_kb) == (sm, sms, tf, bw, smem_sm, smem_block)


def test_arch_specific_atoms():
    t4, a100, h100 = (hp.load_profile(n) for n in ("t4", "a100", "h100"))
    assert t4.mma_atoms == ("SM75_16x8x8",) and not t4.has_cp_async
    assert "SM80_CP_ASYNC_CACHEGLOBAL" not in t4.g2s_copy_atoms
    assert "bf16" not in t4.dtypes
    assert "SM80_16x8x16" in a100.mma_atoms and a100.has_cp_async
    assert h100.nvcc_arch == "sm_90a"  # plain sm_90 silently compiles wgmma away
    assert hp.load_profile("L40S").fp8 and not a100.fp8


def test_unknown_gpu_lists_choices():
    with pytest.raises(hp.ProfileError, match="choose one of: a100, h100, h200, l40s, rtx8000, t4"):
        hp.load_profile("v100")


def _copy_profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(hp._loader.PROFILE_DIR, d, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return d


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace("sm_count = 132", "sm_count = -1"), "sm_count' must be positive"),
        (lambda s: s.replace("sm_count = 132", 'sm_count = "many"'), "sm_count' must be int"),
        (lambda s: re.sub(r"^mma_atoms = .*$", 'mma_atoms = ["SM99_FANCY"]', s, count=1, flags=re.M),
         "unknown atom 'SM99_FANCY'"),
        (lambda s: s.replace("memory_gb = 80\n", ""), "missing field(s): memory_gb"),
        (lambda s: s + "\nwarp_size = 32\n", "unknown field(s): warp_size"),
        (lambda s: s.replace("[9, 0]", "[7, 0]"), "needs compute capability"),
        (lambda s: s.replace("name = ", "name = [", 1), "not valid TOML"),
    ],
)
def test_broken_profile_is_a_clear_error(tmp_path, edit, message):
    d = _copy_profiles(tmp_path)
    f = d / "h100.toml"
    f.write_text(edit(f.read_text()))
    with pytest.raises(hp.ProfileError) as err:
        hp.load_profile("h100", directory=d)
    assert message in str(err.value) and "h100.toml" in str(err.value)


def test_tune_gpus_lists_six_profiles():
    result = CliRunner().invoke(app, ["gpus"])
    assert result.exit_code == 0, result.output
    for name in ("t4", "rtx8000", "a100", "l40s", "h100", "h200"):
        assert f"│ {name} " in result.output
    assert "sm_90a" in result.output and "SM80_CP_ASYNC_CACHEGLOBAL" in result.output
