"""A campaign of a serving layout: `--layout varlen|paged --page-size N` measures the serving mixes
of tuner/measure/mixes.toml, keys the trials' TFLOPS by mix, decides per serving bucket, and refuses bad input."""
import json

import pytest

from hardware_profiles import load_profile
from tuner.campaign import CampaignOptions, run_campaign
from tuner.campaign.combos import ComboError, expand_combinations
from tuner.campaign.options import option_problems
from tuner.campaign.study import study_name

from .conftest import load_study, replay_options


def test_serving_options_are_checked_with_reasons():
    def problems(**kw):
        return " ".join(option_problems(CampaignOptions(gpu="h100", variant="gqa", **kw)))

    assert "--page-size must be one of 16, 32, 64, 128, 256" in problems(layout="paged")
    assert "--page-size must be one of" in problems(layout="paged", page_size=24)
    assert "--page-size applies to --layout paged only" in problems(layout="varlen", page_size=16)
    assert "--layout must be one of dense, varlen, paged" in problems(layout="ragged")
    assert "--seqlens applies to the dense layout" in problems(layout="varlen", seqlens=(512,))
    assert problems(layout="paged", page_size=16) == ""


def test_a_model_preset_asks_for_a_serving_layout_and_gets_its_mixes():
    (combo,) = expand_combinations(load_profile("h100"), None, None, None, None, "llama3-8b", "paged", 16)
    assert combo.spec().layout == "paged" and combo.page_size == 16 and combo.heads == (32, 8)
    names = {p.name: p.bucket for p in combo.problems()}
    assert names["2x(2k on 6k)"] == "t4k-even-p16" and names["1x8k+32x256"] == "t16k-skewed-p16"
    assert {(p.heads_q, p.heads_kv) for p in combo.problems()} == {(32, 8)}
    assert study_name("h100", combo.spec(), heads=combo.heads, page_size=16) == "h100-gqa-bf16-d128-causal-32q8kv-paged16"
    with pytest.raises(ComboError, match="needs a Hopper GPU"):
        expand_combinations(load_profile("a100"), "gqa", None, None, None, None, "varlen")


def test_one_run_for_a_models_serving_resolves_a_study_per_layout_and_phase(tmp_path):
    """`tune --gpu h100 --model llama3-8b --layout all --phase all`: dense, varlen, paged (pages of 16) and decode,
    each its own study in one study dir, with its own search space and problems (the grid, the mixes, the decode
    buckets); bad --page-size values are one line."""
    from rich.console import Console
    from typer.testing import CliRunner

    from tuner.campaign.driver import resolve
    from tuner.commands.cli import app

    camps = resolve(CampaignOptions(gpu="h100", model="llama3-8b", layout="all", phase="all", study_dir=tmp_path),
                    Console(quiet=True))
    assert [c.name for c in camps] == ["h100-gqa-bf16-d128-causal-32q8kv", "h100-gqa-bf16-d128-causal-32q8kv-varlen",
                                       "h100-gqa-bf16-d128-causal-32q8kv-paged16",
                                       "h100-gqa-bf16-d128-causal-32q8kv-paged16-decode"]
    assert [(c.spec.layout, c.spec.phase) for c in camps] == [("dense", "prefill"), ("varlen", "prefill"),
                                                               ("paged", "prefill"), ("paged", "decode")]
    assert camps[0].problems[0].seqlen_k == 512 and camps[1].problems[0].name and camps[3].problems
    for args, words in ((["--page-size", "16,x"], "--page-size must be an integer or a comma list"),
                        (["--page-size", "16,48"], "--page-size must be among"),
                        (["--phase", "all", "--layout", "all,ragged"], "--layout must be dense, varlen, paged")):
        result = CliRunner().invoke(app, ["--gpu", "h100", "--model", "llama3-8b", "--layout", "all",
                                          "--study-dir", str(tmp_path / "cli"), *args])
        assert result.exit_code == 2 and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "cli").exists()


def test_the_feasible_space_of_a_paged_layout_keeps_only_what_builds_it():
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space, layout_reasons
    from translate.params import KernelParams

    (combo,) = expand_combinations(load_profile("h100"), "gqa", None, None, None, None, "paged", 128)
    space = feasible_space(load_space("gqa", layout="paged"), load_profile("h100"), 128, "bf16", combo.shapes(),
                           (("ws_overlap", "ws_overlap"), ("fa2", "fa2")), "paged", 128)
    assert space.points and all(p.sketch == "ws_overlap" for p in space.points)
    # the paged space's own choice (by_layout): the P.V wait after half the exponentials, with either copy; the
    # combination measured at 1.007-1.027x FA4 on 2x(2k on 6k) with pages of 128 is a point of it
    assert {p.params.pv_wait for p in space.points} == {"after", "half"}
    assert any(p.params.g2s_atom == "SM90_TMA" and p.params.pv_wait == "half" and p.params.pingpong
               and not p.params.persistent and (p.params.block_m, p.params.block_n) == (128, 128) for p in space.points)
    assert all(p.params.producer_regs >= 40 for p in space.points)
    # the K/V copy is a dimension here: TMA tiles the pages in boxes, cp.async any multiple of 8 (and its
    # producer keeps 56 registers)
    tma = [p.params for p in space.points if p.params.g2s_atom == "SM90_TMA"]
    indexed = [p.params for p in space.points if p.params.g2s_atom == "SM80_CP_ASYNC_CACHEGLOBAL"]
    assert tma and indexed and len(tma) + len(indexed) == len(space.points)
    assert all(128 % p.block_n == 0 or p.block_n % 128 == 0 for p in tma)
    assert any(128 % p.block_n and p.block_n % 128 for p in indexed)
    assert all(p.producer_regs >= 56 for p in indexed)
    why = layout_reasons(KernelParams(block_m=128, block_n=176, num_warps=8, producer_regs=40, g2s_atom="SM90_TMA"),
                         "ws_overlap", "paged", 128)
    assert why and "page size 128 neither divides block_n 176" in why[0]
    indexed = KernelParams(block_m=128, block_n=176, num_warps=8, producer_regs=56, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL")
    assert layout_reasons(indexed, "ws_overlap", "paged", 128) == []
    assert "spills below it" in layout_reasons(KernelParams(**{**indexed.to_dict(), "producer_regs": 40}),
                                               "ws_overlap", "paged", 16)[0]


@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_only_a_paged_layout_searches_the_cp_async_producer(layout):
    """Dense and varlen studies keep TMA: the copy dimension is set, not suggested (no Optuna name changes for
    them), and a cp.async point is rejected with the reason."""
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space, layout_reasons
    from translate.params import KernelParams

    (combo,) = expand_combinations(load_profile("h100"), "gqa", None, None, None, None, layout)
    space = feasible_space(load_space("gqa"), load_profile("h100"), 128, "bf16", combo.shapes(),
                           (("ws_overlap", "ws_overlap"),), layout)
    assert {p.params.g2s_atom for p in space.points} == {"SM90_TMA"}
    assert all(step.name != "hopper_kv_copy" or len(step.allowed) == 1 for step in space.tree.values())
    indexed = KernelParams(block_m=128, block_n=128, num_warps=8, producer_regs=56, g2s_atom="SM80_CP_ASYNC_CACHEGLOBAL",
                           mma_atom="SM90_GMMA", kv_stages=2)
    assert "only from a paged cache" in layout_reasons(indexed, "ws_overlap", layout)[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout,page", [("varlen", None), ("paged", 16), ("paged", 128)])
def test_a_serving_campaign_measures_the_mixes_and_decides_per_serving_bucket(ray_cluster, tmp_path, layout, page):
    rc = run_campaign(replay_options(tmp_path, trials=8, layout=layout, page_size=page))
    assert rc == 0
    name = f"h100-mha-bf16-d128-causal-{layout}{page or ''}"
    study = load_study(tmp_path, name)
    measured = [t for t in study.trials if t.user_attrs.get("tflops")]
    mixes = {"8x2k", "1x8k+32x256", "64 random 1-512"} | ({"2x(2k on 6k)"} if layout == "paged" else set())
    assert measured and all(set(t.user_attrs["tflops"]) == mixes for t in measured
                            if not t.user_attrs.get("early_stop"))
    assert all(t.user_attrs["schedule"].startswith("ws_") for t in study.trials if t.user_attrs.get("schedule"))
    # the layout's own default for the page size is a seed (paged: the cp.async producer, which no published seed
    # has)
    (own,) = [t for t in study.trials if t.user_attrs.get("source") == f"the {layout} layout's default"]
    assert own.number == 0
    # with pages of 128 (whole tiles) that default is the TMA producer with pv_wait "half" (translate.defaults)
    want = ("SM90_TMA", "half") if page == 128 else (("SM80_CP_ASYNC_CACHEGLOBAL", "after") if page else
                                                    ("SM90_TMA", "after"))
    assert (own.user_attrs["kernel_params"]["g2s_atom"], own.user_attrs["kernel_params"]["pv_wait"]) == want
    # paged: the same kernel with one CTA a tile right after it (translate.defaults.SERVING_SEED_CHANGES: it won the
    # long mix's bucket only), for the per-bucket re-timing to judge
    neighbours = [t for t in study.trials if t.user_attrs.get("source", "").startswith(f"the {layout} layout's default with")]
    if layout == "paged":
        (np_seed,) = neighbours
        assert np_seed.number == 1 and np_seed.user_attrs["kernel_params"] == {
            **own.user_attrs["kernel_params"], "persistent": False}
    else:
        assert neighbours == []
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    buckets = {w["bucket"] for w in summary["winners"]}
    suffix = f"-p{page}" if page else ""
    assert {"t16k-even" + suffix, "t16k-skewed" + suffix, "t16k-short" + suffix} <= buckets


@pytest.mark.parametrize("dtype, layout, page", [("fp8", "paged", 16), ("fp8", "paged", None), ("fp8", "paged", 128),
                                                 ("bf16", "paged", 16), ("fp8", "varlen", None)])
def test_an_fp8_paged_campaign_seeds_its_default_with_the_other_k_copy(dtype, layout, page):
    """FP8 paged: the default first (K by the cp.async producer, or TMA boxes where pages are whole tiles), its
    one-CTA-a-tile neighbour, then the same kernel with the other K copy at that copy's producer registers
    (translate.defaults.fp8_paged_other_k_copy); every seed valid. Other serving campaigns' seeds are as they were."""
    from kernel_abi.spec import KernelSpec, Problem
    from search_spaces.feasible import layout_reasons
    from translate.defaults import CP_ASYNC_PRODUCER_REGS, SERVING_PRODUCER_REGS
    from translate.params import KernelParams, validate
    from tuner.campaign.driver import serving_default_seeds

    profile = load_profile("h200")
    spec = KernelSpec("gqa", 128, 128, True, dtype, layout=layout)
    seeds = serving_default_seeds(profile, spec, page)
    sources = [s for _, s, _ in seeds]
    assert sources[0] == f"the {layout} layout's default"
    params = [KernelParams.from_dict({k: v for k, v in p.items() if k != "schedule"}) for p, _, _ in seeds]
    copies = [p.g2s_atom for p in params]
    cp, tma = "SM80_CP_ASYNC_CACHEGLOBAL", "SM90_TMA"
    if dtype == "fp8" and layout == "paged":
        default, other = (tma, cp) if page == 128 else (cp, tma)
        assert copies == [default, default, other]
        regs = {cp: CP_ASYNC_PRODUCER_REGS, tma: SERVING_PRODUCER_REGS["paged"]}
        assert params[0].producer_regs == regs[default]
        assert params[2] == KernelParams.from_dict({**params[0].to_dict(), "g2s_atom": other,
                                                    "producer_regs": regs[other]})
    elif layout == "paged":
        assert copies == [cp] * 2 and params[1].persistent is False
    else:
        assert copies == [tma] and len(seeds) == 1
    problem = Problem("gqa", 1, 32, 8, 1024, 1024, 128, 128, True, dtype)
    for p in params:
        assert validate(p, profile, problem, warp_specialized=True) == []
        assert layout_reasons(p, "ws_overlap", layout, page) == []


@pytest.mark.parametrize("options", [{}, {"local": True, "softcap": True}])
def test_a_head_dim_256_varlen_campaign_seeds_fa3s_tile_beside_its_default(options):
    """d256 varlen: the 64-key default, then FA3's 128 x 80 with the producer at 24 registers (ahead on the long
    mixes, behind on the short one: the per-bucket re-timing decides); with a window and a cap only the default
    (not measured there). Both seeds valid."""
    from kernel_abi.spec import KernelSpec, Problem
    from translate.params import KernelParams, validate
    from tuner.campaign.driver import serving_default_seeds

    profile = load_profile("h200")
    spec = KernelSpec("gqa", 256, 256, True, "bf16", layout="varlen", **options)
    params = [KernelParams.from_dict({k: v for k, v in p.items() if k != "schedule"})
              for p, _, _ in serving_default_seeds(profile, spec, None)]
    if options:
        assert [(p.block_n, p.producer_regs) for p in params] == [(48, 32)]
        return
    assert [(p.block_n, p.producer_regs) for p in params] == [(64, 32), (80, 24)]
    assert params[1] == KernelParams.from_dict({**params[0].to_dict(), "block_n": 80, "producer_regs": 24})
    problem = Problem("gqa", 1, 8, 1, 1024, 1024, 256, 256, True, "bf16")
    assert all(validate(p, profile, problem, warp_specialized=True) == [] for p in params)
