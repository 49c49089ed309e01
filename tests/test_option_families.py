"""The option-model families of scripts/bench_serving.py (--family): each family's transformers config says what its
model preset says (heads, head dim, window, soft-cap, sinks), its kernel specs carry those options, and the config
builds the transformers model (tiny here) whose attention layers alternate as the preset's layer pattern."""
import importlib.util
from pathlib import Path

import pytest

from tuner.models import get_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_serving.py"
PRESETS = {"gpt-oss": "gpt-oss-20b", "gemma2": "gemma2-9b"}


def _script():
    spec = importlib.util.spec_from_file_location("bench_serving_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_a_familys_config_and_kernels_are_its_presets(family):
    script = _script()
    assert set(script.OPTION_FAMILIES) == set(PRESETS)
    item, preset = script.OPTION_FAMILIES[family], get_model(PRESETS[family])
    config = item["config"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == \
        (preset.heads_q, preset.heads_kv, preset.d_qk)
    assert config.get("sliding_window") == preset.sliding_window
    assert config.get("attn_logit_softcapping", 0.0) == preset.softcap
    features = {kind: set(f) for _, _, f in item["specs"] for kind in ["local" if "local" in f else "global"]}
    options = {kind: preset.options(kind) for kind in preset.layer_kinds()}
    assert set(features) == set(options)
    for kind, wanted in options.items():
        assert ("softcap" in features[kind]) == bool(wanted["softcap"])
        assert ("sinks" in features[kind]) == wanted["sinks"]
    assert all(d == preset.d_qk and variant == preset.variant for variant, d, _ in item["specs"])


def test_the_gemma2_config_builds_a_model_whose_layers_alternate_local_first():
    transformers = pytest.importorskip("transformers")
    from tuner.measure.compiled_apart import FAMILY_CLASSES

    script = _script()
    assert set(FAMILY_CLASSES) == set(script.OPTION_FAMILIES)
    model_name, config_name = FAMILY_CLASSES["gemma2"]
    tiny = dict(script.OPTION_FAMILIES["gemma2"]["config"], vocab_size=64, hidden_size=64, intermediate_size=64,
                head_dim=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    config = getattr(transformers, config_name)(**tiny)
    assert config.attn_logit_softcapping == 50.0 and config.sliding_window == 4096
    assert list(config.layer_types) == ["sliding_attention", "full_attention"]        # the preset's "LG"
    model = getattr(transformers, model_name)._from_config(config, attn_implementation="eager")
    assert len(model.model.layers) == 2
