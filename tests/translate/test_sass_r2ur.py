"""translate.sass.wgmmas_fed_by_r2ur: which wgmmas take a descriptor moved into a uniform register just before."""
from translate.sass import wgmmas_fed_by_r2ur

FED = ["R2UR UR20, R194;", "R2UR UR21, R195;", "WARPGROUP.ARRIVE;", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT;",
       "R2UR UR20, R192;", "R2UR UR21, R193;", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24;"]
UNIFORM = ["UIADD3 UR12, UR4, 0x2, URZ;", "WARPGROUP.ARRIVE;", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT;",
           "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], R24;", "R2UR UR10, R2;", "FADD R1, R2, R3;", "FADD R1, R2, R3;",
           "FADD R1, R2, R3;", "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR12].tnspB, R88;"]


def test_the_wgmmas_behind_an_r2ur_are_listed():
    assert wgmmas_fed_by_r2ur(FED) == [FED[3], FED[6]]


def test_uniform_descriptors_and_a_distant_r2ur_are_not():
    assert wgmmas_fed_by_r2ur(UNIFORM) == []
    assert wgmmas_fed_by_r2ur(UNIFORM, window=4) == [UNIFORM[-1]]
