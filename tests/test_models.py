"""Model presets: the published shapes load, broken files are clear errors, `tune models` lists them."""
import pytest
from typer.testing import CliRunner

from tuner.commands.cli import app
from tuner.models import ModelError, get_model, load_models
from kernel_abi.spec import variant_of_heads
from tuner.commands.models import show_models
from kernel_abi.spec import Problem


def test_required_presets_have_published_numbers():
    # (variant, heads_q, heads_kv, d_qk, d_v) from the models' config.json
    expected = {"llama3-8b": ("gqa", 32, 8, 128, 128), "qwen2.5-72b": ("gqa", 64, 8, 128, 128),
                "deepseek-v3": ("mla", 128, 128, 192, 128)}
    for name, shape in expected.items():
        m = get_model(name)
        assert (m.variant, m.heads_q, m.heads_kv, m.d_qk, m.d_v) == shape
        assert m.causal == (True,) and m.dtypes == ("bf16",)
        assert "config.json" in m.description


def test_every_preset_makes_a_valid_problem():
    # The loader's variant rule must agree with validate_problem, or a preset could not run.
    for m in load_models().values():
        p = Problem(m.variant, 1, m.heads_q, m.heads_kv, 128, 128, m.d_qk, m.d_v, m.causal[0], m.dtypes[0])
        assert p.group == m.heads_q // m.heads_kv


def test_lookup_ignores_case_and_unknown_lists_choices():
    assert get_model("  Llama3-8B ").name == "llama3-8b"
    with pytest.raises(ModelError, match=r"unknown model 'gpt-5'; choose one of: .*llama3-8b.*deepseek-v3"):
        get_model("gpt-5")


def test_variant_of_heads():
    assert [variant_of_heads(*h) for h in ((32, 32), (32, 1), (32, 8), (1, 1))] == ["mha", "mqa", "gqa", "mha"]


PRESET = """["my-model"]
description = "test preset"
variant = "gqa"
heads_q = 32
heads_kv = 8
d_qk = 128
d_v = 128
causal = [true]
dtypes = ["bf16"]
"""


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace('variant = "gqa"', 'variant = "mha"'), "variant 'mha' does not match heads 32q/8kv"),
        (lambda s: s.replace("heads_kv = 8", "heads_kv = 1"), "variant 'gqa' does not match heads 32q/1kv"),
        (lambda s: s.replace("heads_kv = 8", "heads_kv = 6"), "heads_q (32) must be a multiple of heads_kv (6)"),
        (lambda s: s.replace('variant = "gqa"', 'variant = "mla"'), "mla kernels have head dims 192/128"),
        (lambda s: s.replace("d_qk = 128\nd_v = 128", "d_qk = 128\nd_v = 64"), "have d_qk == d_v"),
        (lambda s: s + 'layers = "LX"\nsliding_window = 64\n', "repeating pattern of L (local) and G (global)"),
        (lambda s: s + 'layers = "LG"\n', "needs 'sliding_window'"),
        (lambda s: s + "sliding_window = 64\nlayers = \"G\"\n", "needs 'sliding_window', and 'sliding_window' needs L"),
        (lambda s: s + "sliding_window = 0\n", "field 'sliding_window' must be >= 1"),
        (lambda s: s + "softcap = -1.0\n", "field 'softcap' must be a finite number >= 0"),
        (lambda s: s + 'sinks = "yes"\n', "field 'sinks' must be bool"),
        (lambda s: s + "sliding_window = true\n", "field 'sliding_window' must be int"),
        (lambda s: s.replace("heads_q = 32", "heads_q = true"), "field 'heads_q' must be int"),
        (lambda s: s.replace("causal = [true]", "causal = []"), "field 'causal' must list"),
        (lambda s: s.replace('dtypes = ["bf16"]', 'dtypes = ["fp4"]'), "field 'dtypes' must list"),
        (lambda s: s + "rope_theta = 500000.0\n", "unknown field(s): rope_theta"),
        (lambda s: s.replace("d_v = 128\n", ""), "missing field(s): d_v"),
        (lambda s: s.replace('["my-model"]', '["My-Model"]'), "must be lowercase"),
        (lambda s: s.replace("heads_q = ", "heads_q = [", 1), "not valid TOML"),
    ],
)
def test_broken_models_file_is_a_clear_error(tmp_path, edit, message):
    f = tmp_path / "models.toml"
    f.write_text(edit(PRESET))
    with pytest.raises(ModelError) as err:
        load_models(f)
    assert message in str(err.value) and str(f) in str(err.value)
    if "TOML" not in message:  # a parse error has no preset to name
        assert "my-model" in str(err.value).lower()


def test_the_valid_test_preset_loads(tmp_path):
    f = tmp_path / "models.toml"
    f.write_text(PRESET)
    assert get_model("my-model", f).heads_q == 32


def test_tune_models_lists_presets():
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    for name in load_models():
        assert f"│ {name} " in result.output
    assert "32/8" in result.output and "192/128" in result.output


def test_broken_models_file_exits_2_with_one_line(tmp_path, capsys):
    f = tmp_path / "models.toml"
    f.write_text(PRESET.replace("heads_kv = 8", "heads_kv = 32"))
    assert show_models(path=f) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tune: error:") and "my-model" in err


def test_the_presets_of_models_with_attention_options():
    """config.json's numbers, the layer pattern (L local, G global) and the kernel options of each kind of layer
    (a sliding window W is FlashAttention's (W - 1, 0): W keys up to and including the query's own)."""
    expected = {
        "gpt-oss-20b": (("gqa", 64, 8, 64), 128, 0.0, True, "LG"),
        "mistral-7b-v0.1": (("gqa", 32, 8, 128), 4096, 0.0, False, "L"),
        "gemma2-9b": (("gqa", 16, 8, 256), 4096, 50.0, False, "LG"),
        "gemma3-12b": (("gqa", 16, 8, 256), 1024, 0.0, False, "LLLLLG"),
        "phi3-mini": (("mha", 32, 32, 96), 2047, 0.0, False, "L"),
    }
    for name, (shape, window, cap, sinks, layers) in expected.items():
        m = get_model(name)
        assert (m.variant, m.heads_q, m.heads_kv, m.d_qk) == shape and m.d_v == m.d_qk
        assert (m.sliding_window, m.softcap, m.sinks, m.layers) == (window, cap, sinks, layers)
        assert m.options("local") == {"window": (window - 1, 0), "softcap": cap, "sinks": sinks}
    assert get_model("gemma2-9b").options("global") == {"window": (-1, -1), "softcap": 50.0, "sinks": False}
    assert get_model("gemma3-12b").layer_kinds() == ("local", "global")
    assert get_model("mistral-7b-v0.1").layer_kinds() == ("local",)
    with pytest.raises(ModelError, match="mistral-7b-v0.1 has no global layers"):
        get_model("mistral-7b-v0.1").options("global")
    assert get_model("llama3-8b").layer_kinds() == ("global",) and get_model("llama3-8b").options("global") == {
        "window": (-1, -1), "softcap": 0.0, "sinks": False}
    assert get_model("gemma2-9b").kernel_support() is None and get_model("gemma3-12b").kernel_support() is None
    assert get_model("phi3-mini").kernel_support() is None   # head dim 96: 64-byte swizzle atoms (translate/sm90)
    import dataclasses

    assert "head dim 80, which the kernels do not take yet" in \
        dataclasses.replace(get_model("phi3-mini"), d_qk=80, d_v=80).kernel_support()
    assert get_model("gpt-oss-20b").kernel_support() is None


def test_a_bench_of_a_preset_takes_its_layers_options_and_refuses_what_the_kernels_cannot():
    from tuner.build import NO_OPTIONS, ModelOptions, UsageError
    from tuner.commands.bench import preset_options

    options, note = preset_options("gpt-oss-20b", None, NO_OPTIONS)
    assert options == ModelOptions((127, 0), 0.0, True) and "gpt-oss-20b local layers" in note
    options, _ = preset_options("gpt-oss-20b", "global", NO_OPTIONS)
    assert options == ModelOptions((-1, -1), 0.0, True)
    given = ModelOptions((4095, 0), 0.0, False)
    assert preset_options("gpt-oss-20b", None, given)[0] == given              # the flags win
    assert preset_options("llama3-8b", None, NO_OPTIONS) == (NO_OPTIONS, None)
    with pytest.raises(UsageError, match="mistral-7b-v0.1 has local layers; --layer global is not one of them"):
        preset_options("mistral-7b-v0.1", "global", NO_OPTIONS)
    with pytest.raises(UsageError, match="give --model"):
        preset_options(None, "local", NO_OPTIONS)
    # Phi-3-mini (head dim 96): its config's sliding window of 2047 on every layer, FlashAttention's (2046, 0)
    options, note = preset_options("phi3-mini", None, NO_OPTIONS)
    assert options == ModelOptions((2046, 0), 0.0, False) and "phi3-mini local layers" in note


def _models_with_head_dim_80(tmp_path, monkeypatch):
    import tuner.models

    text = tuner.models.MODELS_FILE.read_text() + (
        '\n["wide-80"]\ndescription = "a made-up model of head dim 80"\nvariant = "mha"\nheads_q = 16\n'
        'heads_kv = 16\nd_qk = 80\nd_v = 80\ncausal = [true]\ndtypes = ["bf16"]\n')
    (tmp_path / "models.toml").write_text(text)
    monkeypatch.setattr(tuner.models, "MODELS_FILE", tmp_path / "models.toml")


def test_a_bench_of_a_preset_whose_head_dims_the_kernels_lack_is_refused(tmp_path, monkeypatch):
    _models_with_head_dim_80(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["bench", "--gpu", "h100", "--model", "wide-80"])
    assert result.exit_code == 2 and "head dim 80, which the kernels do not take yet" in result.stderr


def test_a_campaign_of_a_preset_whose_head_dims_the_kernels_lack_is_one_line(tmp_path, monkeypatch):
    _models_with_head_dim_80(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["--gpu", "h100", "--model", "wide-80", "--dry-run", "--study-dir",
                                      str(tmp_path / "s")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "head dim 80, which the kernels do not take yet" in result.stderr
    assert not (tmp_path / "s").exists()
