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
        (lambda s: s.replace("d_qk = 128\nd_v = 128", "d_qk = 256\nd_v = 256"), "take d_qk == d_v in (64, 128)"),
        (lambda s: s.replace("heads_q = 32", "heads_q = true"), "field 'heads_q' must be int"),
        (lambda s: s.replace("causal = [true]", "causal = []"), "field 'causal' must list"),
        (lambda s: s.replace('dtypes = ["bf16"]', 'dtypes = ["fp8"]'), "field 'dtypes' must list"),
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
