"""scripts/decode_trace.py on the CPU: the phase summary of a call's stamps, the wait sites read from the seesaw's
enum and their shares of the loop, the --points parser, and a build folder without the seesaw kernel refused; with
nvcc, the trace build carries the globaltimer stamps (and with --waits the clock reads) that the measured build
(tests/decode/test_mla_seesaw.py) must not."""
import shutil
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import decode_trace as dt  # noqa: E402


def stamps(rows):
    """(ctas, 8) stamps in ns from per-CTA phase times in us (start, q, first scores, loop end, staged, end) and SM."""
    out = np.zeros((len(rows), dt.SLOTS), dtype=np.uint64)
    for i, (times, sm) in enumerate(rows):
        out[i, :len(times)] = [1_000_000 + int(t * 1000) for t in times]
        out[i, dt.SLOTS - 1] = sm
    return out


def test_the_summary_measures_each_phase_from_the_first_start():
    s = dt.summarise(stamps([((0, 6, 9, 129, 130, 133), 0), ((1, 7, 10, 131, 132, 136), 1)]), ctas_per_sm_wave=132)
    assert s["ctas"] == 2 and s["sms"] == 2 and s["waves"] == 1
    assert s["span"] == 136.0                            # the last end, from the earliest start
    assert s["q_loaded"][1] == 6.0 and s["first_scores"][1] == 9.0
    assert s["loop"][1] == 120.5 and s["staging"][1] == 1.0 and s["store"][1] == 3.5
    assert s["end"] == [133.3, 134.5, 135.7]             # 10th/50th/90th percentile over the CTAs


def test_two_waves_are_counted_from_the_sms():
    rows = [((0, 6, 9, 100, 101, 104), i % 132) for i in range(256)]
    assert dt.summarise(stamps(rows), ctas_per_sm_wave=132)["waves"] == 2


def test_the_wait_sites_are_the_seesaws_enum_with_a_loop_per_warpgroup():
    sites = dt.wait_sites()
    assert len(sites) == 14 and max(sites) < dt.WAIT_SLOTS
    assert sites[16] == "wg0: the whole loop" and sites[17] == "wg1: the whole loop"
    assert sites[11] == "wg1: left chunks of tile j0 + 3"
    assert all(label.startswith(("wg0: ", "wg1: ")) for label in sites.values())


def test_a_header_naming_a_site_twice_is_refused(tmp_path):
    header = tmp_path / "h.cuh"
    header.write_text("  kWaitA = 3,   // wg0: a\n  kWaitB = 3,   // wg0: b\n")
    with pytest.raises(ValueError, match="taken twice"):
        dt.wait_sites(header)
    header.write_text("enum {};\n")
    with pytest.raises(ValueError, match="names no wait sites"):
        dt.wait_sites(header)


def test_wait_shares_are_of_the_same_warpgroups_loop():
    sites = {0: "wg0: a", 1: "wg1: b", 16: "wg0: the whole loop", 17: "wg1: the whole loop"}
    w = np.zeros((3, dt.WAIT_SLOTS), dtype=np.uint64)
    w[:, 16], w[:, 17] = 1000, 2000
    w[:, 0] = [100, 200, 300]     # wg0 waits 10-30% of its loop
    w[:, 1] = [500, 500, 500]     # wg1 waits a quarter of its (longer) loop
    w[2, 17] = 0                  # a CTA without a loop (no tiles) is left out: its shares are undefined
    rows = {r["site"]: r for r in dt.summarise_waits(w, sites)}
    assert rows[0]["share"] == 0.15 and rows[0]["kcycles"] == 0.1
    assert rows[1]["share"] == 0.25 and rows[17]["share"] == 1.0


def test_points_parse_and_bad_ones_say_what_is_expected(capsys):
    from tuner.measure.decode import parse_mla_points

    p = parse_mla_points("64x4096,8x16384x2")
    assert [(x.batch, x.kv_len, x.seqlen_q, x.heads_q) for x in p] == [(64, 4096, 1, 128), (8, 16384, 2, 128)]
    with pytest.raises(ValueError, match="'64x' is not BATCHxKEYS"):
        parse_mla_points("64x4096,64x")
    with pytest.raises(SystemExit):   # the script says so before it loads anything
        dt.main(["run", "nowhere", "--points", "64x"])
    assert "--points: '64x' is not BATCHxKEYS" in capsys.readouterr().err


def test_build_refuses_a_folder_without_sources_and_skips_other_kernels(tmp_path, capsys):
    with pytest.raises(SystemExit, match="holds no .cu"):
        dt.build(tmp_path, tmp_path / "out")
    (tmp_path / "k.cu").write_text('#include "attn_decode.cuh"\n')
    (tmp_path / "k.json").write_text("{}")
    dt.build(tmp_path, tmp_path / "out")
    assert "not the seesaw kernel" in capsys.readouterr().out


@pytest.mark.slow
def test_the_trace_build_stamps_the_phases(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    sys.path.insert(0, str(Path(__file__).resolve().parent / "decode"))
    from test_mla_seesaw import kernel
    from translate.sass import find_cuobjdump, sass_instructions

    k = kernel()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / f"{k.name}.cu").write_text(k.source)
    (tmp_path / "src" / f"{k.name}.json").write_text("{}")
    dt.build(tmp_path / "src", tmp_path / "out")
    try:
        find_cuobjdump()
    except Exception:
        pytest.skip("cuobjdump not installed")
    lines = sass_instructions(tmp_path / "out" / f"{k.name}.cubin")[k.name]
    assert sum("GLOBALTIMER" in line for line in lines) == len(dt.PHASES)
    assert not any("SR_CLOCK" in line for line in lines), "wait sums without --waits"
    dt.build(tmp_path / "src", tmp_path / "waits", waits=True)
    lines = sass_instructions(tmp_path / "waits" / f"{k.name}.cubin")[k.name]
    # a clock read before and after each of the 12 sites and the loop (ptxas may share a read between neighbours)
    assert sum("SR_CLOCK" in line for line in lines) >= 12, "no clock reads around the waits"
