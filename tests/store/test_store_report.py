import io

from rich.console import Console
from store_fakes import make_record

from tuner.campaign.liveview import LiveView
from tuner.campaign.report import best_so_far, final_table, write_report

TRIALS = [
    {"number": 0, "state": "COMPLETE", "tflops": 210.0, "source": "llm", "params": {"block_m": 64}},
    {"number": 1, "state": "PRUNED", "tflops": None, "reason": "smem 240 KB over the 227 KB limit"},
    {"number": 2, "state": "complete", "value": 305.5, "source": "tpe", "params": {"block_m": 128}},
    {"number": 3, "state": "FAIL", "reason": "ray worker died"},
    {"number": 4, "state": "complete", "tflops": 250.0},
    {"number": 5, "state": "TrialState.PRUNED", "reason": "smem 240 KB over the 227 KB limit"},
]
ROWS = [{"seqlen": s, "causal": c, "ours": 300.0 + s / 1000, "flash": 290.0, "cudnn": 500.0 if s > 512 else None,
         "efficient": 150.0} for s in (512, 1024, 4096, 16384) for c in (False, True)]


def test_best_so_far_is_a_running_maximum_of_complete_trials():
    assert best_so_far(TRIALS) == [(0, 210.0), (1, 210.0), (2, 305.5), (3, 305.5), (4, 305.5), (5, 305.5)]
    assert best_so_far([{"number": 0, "state": "FAIL"}]) == []


def test_report_writes_markdown_and_png_plots(tmp_path):
    best = make_record(tflops=305.5)
    path = write_report(tmp_path / "study", TRIALS, best, ROWS)
    text = path.read_text()
    assert path.name == "report.md"
    for png in ("best_so_far.png", "tflops_vs_seqlen.png"):
        data = (tmp_path / "study" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({png})" in text
    assert "complete 3, infeasible 2, failed 1" in text
    assert "**305.5 TFLOPS**" in text and "ours ×0.93" in text and "ours ×0.52" in text   # vs 330 and 590
    assert "| smem 240 KB over the 227 KB limit | 2 |" in text
    assert "| causal s16384 | 316.4 | 290.0 | 500.0 | 150.0 | – | 1.09 | 0.63 | 2.11 | – |" in text
    assert "| non-causal s512 | 300.5 | 290.0 | – |" in text
    assert "without a number" not in text     # no row says why a library has none


def test_report_shows_fa4_measured_or_not_installed_with_the_reason(tmp_path):
    why = "not installed: flash_attn.cute is not importable (ModuleNotFoundError: No module named 'flash_attn')"
    rows = [dict(ROWS[0], fa4=600.0), dict(ROWS[1], fa4=None, fa4_err=why),
            dict(ROWS[3], fa4=None, fa4_err=why), dict(ROWS[5], fa4=None, fa4_err="head_dim 96 is not supported")]
    text = write_report(tmp_path, TRIALS, make_record(tflops=305.5), rows).read_text()
    assert "| torch flash | cuDNN | efficient | FA4 | ours/torch flash |" in text and "| ours/FA4 |" in text
    assert "| non-causal s512 | 300.5 | 290.0 | – | 150.0 | 600.0 | 1.04 | – | 2.00 | 0.50 |" in text
    assert "| causal s512 | 300.5 | 290.0 | – | 150.0 | not installed | 1.04 | – | 2.00 | – |" in text
    assert "| causal s4096 | 304.1 | 290.0 | 500.0 | 150.0 | – | 1.05 | 0.61 | 2.03 | – |" in text
    assert f"- FA4 (causal s512, causal s1024): {why}" in text
    assert "- FA4 (causal s4096): head_dim 96 is not supported" in text


def test_report_without_a_kernel_or_benchmarks(tmp_path):
    path = write_report(tmp_path, [{"number": 0, "state": "PRUNED", "reason": "compile error"}], None, [])
    text = path.read_text()
    assert "No verified kernel" in text and "compile error" in text
    assert not (tmp_path / "best_so_far.png").exists() and not (tmp_path / "tflops_vs_seqlen.png").exists()


def _render(renderable) -> str:
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def test_final_table_shows_ratios_against_flash_and_cudnn():
    rows = [{"label": "mha d128 causal s16384", "ours": 400.0, "flash": 320.0, "cudnn": 600.0},
            {"label": "mla causal s4096", "ours": 350.0, "flash": None, "cudnn": 560.0, "efficient": 140.0}]
    text = _render(final_table(rows))
    assert "torch flash" in text and "cuDNN" in text and "efficient" in text
    line = next(l for l in text.splitlines() if "mha d128" in l)
    assert "1.25×" in line and "0.67×" in line
    mla = next(l for l in text.splitlines() if "mla" in l)
    assert "2.50×" in mla and "–" in mla


def test_the_report_has_a_column_for_every_measured_baseline():
    from tuner.measure import dense
    from tuner.campaign.report import BASELINES

    assert [key for key, _ in BASELINES] == list(dense.BASELINES)


def test_final_table_has_an_fa4_column_measured_or_not_installed():
    rows = [{"label": "s4096", "ours": 400.0, "flash": 320.0, "cudnn": 600.0, "fa4": 640.0},
            {"label": "s8192", "ours": 400.0, "flash": 320.0, "cudnn": 600.0, "fa4": None,
             "fa4_err": "not installed: flash_attn.cute is not importable"}]
    text = _render(final_table(rows))
    assert "FA4" in text and "ours/FA4" in text
    assert "640.0" in next(l for l in text.splitlines() if "s4096" in l) and "0.62×" in text
    assert "not installed" in next(l for l in text.splitlines() if "s8192" in l)


def test_live_view_prints_plain_lines_when_not_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, width=300, force_terminal=False)
    with LiveView("h100 mha", console=console) as view:
        assert view.plain
        view.update(3, 1, 0, 250.0, "flash", 240.0, 65.0, 3600.0)
        view.update(3, 1, 0, 250.0, "flash", 240.0, 70.0, 3590.0)     # nothing new: no line
        view.update(4, 1, 1, 331.0, "flash", 320.0, 4000.0, "17 trials")
    lines = buf.getvalue().splitlines()
    assert lines[0] == ("[h100 mha] trials 3 done, 1 infeasible, 0 failed | best 250.0 TFLOPS (beats flash 240.0, "
                        "×1.04) | elapsed 1:05, remaining 1:00:00")
    assert "4 done, 1 infeasible, 1 failed" in lines[1] and "remaining 17 trials" in lines[1]
    assert "elapsed 1:06:40" in lines[1]
    assert len(lines) == 3 and lines[2] == lines[1]                    # the final state on exit
    assert "\x1b[" not in buf.getvalue()


def test_live_view_before_any_success_and_on_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True)
    with LiveView("t4 mla", console=console) as view:
        assert not view.plain
        view.update(0, 2, 0, None, None, None, 5.0, None)
    out = buf.getvalue()
    assert "2 infeasible" in out and "best –" in out


def test_the_report_shows_each_buckets_re_timed_ratio_with_its_interval_and_what_the_store_did(tmp_path):
    def contender(role, trial, tflops, sha, source="search", seeded=False):
        return {"role": role, "kernel_name": f"k{trial}", "trial": trial, "source": source, "seeded": seeded,
                "schedule": "ws_overlap", "params": {}, "sha256": sha, "tflops": tflops, "stem": ""}

    win = {"ratio": 1.021, "low": 1.008, "high": 1.034, "rounds": 9, "confidence": 0.95, "confirmed": True}
    tie = {"ratio": 1.004, "low": 0.991, "high": 1.012, "rounds": 9, "confidence": 0.95, "confirmed": False}
    stored = dict(contender("stored", None, 590.0, "old", "stored: study x, trial 3"), kernel_name="k3")
    winners = [
        {"bucket": "s4096", "challenger": contender("challenger", 37, 599.0, "c"),
         "seed": contender("seed", 1, 586.9, "s", "fa4", True), "stored": stored, "winner": "challenger",
         "vs_seed": win, "vs_stored": win, "search_beat_seeds": True, "store": True, "note": "challenger wins"},
        {"bucket": "s8192", "challenger": contender("challenger", 40, 657.2, "c2"),
         "seed": contender("seed", 1, 655.2, "s", "fa4", True), "stored": dict(stored, sha256="s"),
         "winner": "seed", "vs_seed": tie, "vs_stored": None, "search_beat_seeds": False, "store": False,
         "note": "challenger ×1.004 [0.991, 1.012] the best seed: not clearly faster, the seed stands"},
        {"bucket": "s16384", "challenger": contender("challenger", 1, 665.5, "s", "fa4", True), "seed": None,
         "stored": stored, "winner": "challenger", "vs_seed": None, "vs_stored": tie, "search_beat_seeds": False,
         "store": False, "note": "kept"},
    ]
    text = write_report(tmp_path, TRIALS, make_record(tflops=305.5), ROWS, winners).read_text()
    assert "## Bucket winners, re-timed" in text
    assert ("| s4096 | trial 37 (search) 599.0 | trial 1 586.9 | **×1.021 [1.008, 1.034]** | trial 37 (search) | "
            "k3 (stored: study x, trial 3) | **×1.021 [1.008, 1.034]** | stored |") in text
    assert "| s8192 | trial 40 (search) 657.2 | trial 1 655.2 | ×1.004 [0.991, 1.012] | trial 1 (fa4) |" in text
    assert text.split("| s8192 |")[1].split("\n")[0].endswith("| – | already stored |")
    assert "| s16384 | trial 1 (fa4) 665.5 | the same | – | trial 1 (fa4) |" in text
    assert text.split("| s16384 |")[1].split("\n")[0].endswith("| ×1.004 [0.991, 1.012] | kept the stored kernel |")
    assert "- s8192: challenger ×1.004 [0.991, 1.012] the best seed: not clearly faster, the seed stands" in text
