"""The report on a machine without matplotlib (GPU images often lack it): written whole, plots skipped
with a note, the numbers still there."""
import sys

from store_fakes import make_record
from test_store_report import ROWS, TRIALS

from tuner.campaign.report import write_report


def test_report_without_matplotlib_skips_plots_and_says_so(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # `import matplotlib` raises ImportError
    path = write_report(tmp_path / "study", TRIALS, make_record(tflops=305.5), ROWS)
    text = path.read_text()
    assert not list((tmp_path / "study").glob("*.png"))
    assert "plots skipped: matplotlib is not installed" in text
    assert "trial 0: 210.0, trial 2: 305.5" in text               # the best-so-far curve as text
    assert "| causal s16384 | 316.4 | 290.0 | 500.0 | 150.0 | – | 1.09 | 0.63 | 2.11 | – |" in text
    assert "**305.5 TFLOPS**" in text
