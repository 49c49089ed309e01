"""scripts/ncu_sass_stalls.py on the CPU: an ncu source page (SASS with stall samples) summed per opcode, and two
kernels' difference per stall reason."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ncu_sass_stalls as nss  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait",'
          '"stall_barrier","stall_wait (Not Issued)"')


def kernel(name, rows):
    return [f'"Kernel Name","{name}",', HEADER] + [
        f'"0x{i:x}","{src}","{s}","{n:,}","{w}","{b}","0"' for i, (src, s, n, w, b) in enumerate(rows)]


def test_opcodes_sum_and_two_kernels_differ_per_reason(tmp_path, capsys):
    ours = kernel("ours", [("MUFU.EX2 R1, R1", 10, 2000, 8, 0), ("MUFU.EX2 R2, R2", 6, 2000, 5, 0),
                           ("@!P0 BRA 0x7f00", 4, 1000, 1, 0), ("F2FP.BF16.F32.PACK_AB R3, R1, R2", 9, 1000, 9, 0)])
    fa4 = kernel("fa4", [("MUFU.EX2 R1, R1", 12, 4000, 7, 0), ("BAR.SYNC.DEFER_BLOCKING R9, 0x100", 8, 500, 0, 8),
                         ("F2FP.BF16.F32.PACK_AB R3, R1, R2", 1, 1000, 1, 0)])
    path = tmp_path / "p.source.csv"
    path.write_text("\n".join(ours + fa4) + "\n")
    a, b = nss.load(path)
    ops = nss.per_opcode(a)
    assert ops["MUFU"]["executed"] == 4000 and ops["MUFU"]["samples"] == 16 and ops["BRA"]["stall_wait"] == 1
    assert nss.opcode("@!P0 BRA 0x7f00") == "BRA" and nss.opcode("F2FP.BF16.F32.PACK_AB R3") == "F2FP"
    diff = {reason: (ta, tb, dict(top)) for reason, ta, tb, top in nss.stall_diff(a, b)}
    assert diff["stall_wait"][:2] == (23, 8) and diff["stall_wait"][2]["F2FP"] == 8
    assert diff["stall_barrier"][:2] == (0, 8) and diff["stall_barrier"][2]["BAR"] == -8
    assert nss.main([str(path), "--diff", "0", "1"]) == 0 and "wait | 23 | 8 | +15" in capsys.readouterr().out
    assert nss.main([str(path), "--hot", "0", "--top", "1"]) == 0 and "MUFU.EX2 R1, R1" in capsys.readouterr().out


def test_bad_input_is_refused_with_the_reason(tmp_path, capsys):
    raw = tmp_path / "p.raw.csv"
    raw.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"","","ms"\n"0","k","2.5"\n')
    assert nss.main([str(raw)]) == 2 and "not an ncu source page" in capsys.readouterr().err
    path = tmp_path / "p.source.csv"
    path.write_text("\n".join(kernel("ours", [("MUFU.EX2 R1, R1", 1, 1, 1, 0)])) + "\n")
    assert nss.main([str(path), "--diff", "0", "3"]) == 2 and "no kernel 3" in capsys.readouterr().err
