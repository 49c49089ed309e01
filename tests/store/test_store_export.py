import hashlib
import json

import pytest
from store_fakes import make_record
from typer.testing import CliRunner

from tuner.store.export import config_file_name, export_records, run_export
from tuner.store.records import KernelStore

H100_MHA = "variant=mha,head_dim=128,dtype=bf16,causal=1,device_name=NVIDIA_H100_80GB_HBM3.json"
H100_MLA = "variant=mla,head_dim=192_128,dtype=bf16,causal=0,device_name=NVIDIA_H100_80GB_HBM3.json"


@pytest.fixture
def study(tmp_path):
    store = KernelStore(tmp_path / "studies")
    store.offer(make_record(bucket="s512", tflops=180.0, cubin=b"cubin-512"))
    store.offer(make_record(bucket="s16384", tflops=360.0, cubin=b"cubin-16k"))
    store.offer(make_record(variant="mla", d_qk=192, d_v=128, causal=False, bucket="s4096", tflops=300.0,
                            cubin=b"cubin-mla", baselines={"flash": None, "cudnn": 560.0, "efficient": 140.0}))
    store.offer(make_record(gpu="a100", arch="sm80", device_name="NVIDIA A100-SXM4-80GB", cubin=b"a100"))
    return tmp_path / "studies"


def test_export_writes_one_vllm_named_json_per_spec_and_device(study, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_export(gpu="h100", variant=None, study_dir=study, out_dir=out) == 0
    assert sorted(p.name for p in out.glob("*.json")) == sorted([H100_MHA, H100_MLA])
    assert "exported 3 kernel(s) in 2 config file(s)" in capsys.readouterr().out


def test_export_json_content_and_kernel_files(study, tmp_path):
    out = tmp_path / "out"
    run_export(gpu="H100", variant="mha", study_dir=study, out_dir=out)
    assert [p.name for p in out.glob("*.json")] == [H100_MHA]
    doc = json.loads((out / H100_MHA).read_text())
    meta = doc["_metadata"]
    assert meta["tool_version"] == "0.1.0" and meta["nvcc"] == "13.0.88" and meta["cutlass"] == "4.2.0"
    assert meta["driver"] == "580.159" and meta["gpu_name"] == "NVIDIA H100 80GB HBM3" and meta["sm"] == 90
    assert (meta["variant"], meta["d_qk"], meta["d_v"], meta["dtype"], meta["causal"]) == ("mha", 128, 128, "bf16", True)
    assert "exported_at" in meta and "NVIDIA H100 80GB HBM3" in meta["device_names"]
    assert sorted(k for k in doc if k != "_metadata") == ["s16384", "s512"]
    entry = doc["s16384"]
    sha = hashlib.sha256(b"cubin-16k").hexdigest()
    assert entry["kernel_sha256"] == sha and entry["cubin"] == f"{sha}.cubin" and entry["seqlen_k"] == 16384
    assert (out / entry["cubin"]).read_bytes() == b"cubin-16k"
    assert (out / entry["source"]).read_text().startswith('extern "C"')
    assert (out / entry["program"]).exists()
    assert entry["tflops"] == 360.0
    assert entry["baselines"] == {"flash": 330.0, "cudnn": 590.0, "efficient": 170.0}
    assert entry["ratios"]["cudnn"] == round(360 / 590, 4)
    assert entry["verification"] == {"passed": True, "max_rel_error": 0.004, "checks_count": 2}
    assert entry["params"]["block_m"] == 128 and entry["meta"]["num_threads"] == 128
    assert entry["provenance"]["hostname"] == "node1"
    assert entry["confirmation"] is None          # stored by hand (offer), not by a campaign's re-timing


def test_mla_config_names_both_head_dims_and_keeps_missing_baselines(study, tmp_path):
    out = tmp_path / "out"
    run_export(gpu="h100", variant="mla", study_dir=study, out_dir=out)
    doc = json.loads((out / H100_MLA).read_text())
    assert doc["s4096"]["baselines"]["flash"] is None and doc["s4096"]["ratios"]["flash"] is None
    assert doc["_metadata"]["d_qk"] == 192


def test_device_name_token_turns_odd_characters_into_underscores():
    name = config_file_name("gqa", 64, 64, "fp16", False, "NVIDIA A100-SXM4-80GB (MIG 1g/10gb)")
    assert name == "variant=gqa,head_dim=64,dtype=fp16,causal=0,device_name=NVIDIA_A100-SXM4-80GB__MIG_1g_10gb_.json"


def test_unknown_gpu_lists_the_choices(study, tmp_path, capsys):
    assert run_export(gpu="b200", variant=None, study_dir=study, out_dir=tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'b200'" in err and "h100" in err and "t4" in err
    assert not (tmp_path / "o").exists()


def test_unknown_variant_lists_the_choices(study, tmp_path, capsys):
    assert run_export(gpu="h100", variant="mqx", study_dir=study, out_dir=tmp_path / "o") == 2
    assert "mha, gqa, mqa, mla" in capsys.readouterr().err


def test_no_stored_kernels_is_a_clear_message(tmp_path, capsys):
    assert run_export(gpu="h100", variant=None, study_dir=tmp_path / "empty", out_dir=tmp_path / "o") == 1
    assert "no stored kernels for h100" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_kernels_of_another_gpu_of_the_arch_are_not_exported_but_named(tmp_path, capsys):
    KernelStore(tmp_path / "s").offer(make_record(gpu="h200", device_name="NVIDIA H200"))
    assert run_export(gpu="h100", variant=None, study_dir=tmp_path / "s", out_dir=tmp_path / "o") == 1
    assert "measured on h200" in capsys.readouterr().err


def test_unverified_record_refuses_the_export(study, tmp_path, capsys):
    # The store never writes one; a hand-edited record.json must still not reach production.
    path = study / "kernels/sm90/mha/bf16-d128x128-causal/s512/record.json"
    data = json.loads(path.read_text())
    data["verification"] = {"passed": False, "reason": "max error 0.3"}
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert run_export(gpu="h100", variant=None, study_dir=study, out_dir=out) == 1
    assert "did not pass verification" in capsys.readouterr().err
    assert not out.exists() or list(out.iterdir()) == []


def test_corrupt_store_is_an_error_naming_the_file(study, tmp_path, capsys):
    path = study / "kernels/sm90/mha/bf16-d128x128-causal/s512/record.json"
    path.write_text("{")
    assert run_export(gpu="h100", variant=None, study_dir=study, out_dir=tmp_path / "o") == 2
    assert str(path) in capsys.readouterr().err


def test_studies_one_level_down_are_found_and_the_best_wins(tmp_path):
    KernelStore(tmp_path / "studies" / "run1").offer(make_record(tflops=300.0, cubin=b"slow"))
    KernelStore(tmp_path / "studies" / "run2").offer(make_record(tflops=333.0, cubin=b"fast"))
    out = tmp_path / "out"
    assert run_export(gpu="h100", variant=None, study_dir=tmp_path / "studies", out_dir=out) == 0
    doc = json.loads((out / H100_MHA).read_text())
    assert doc["s4096"]["kernel_sha256"] == hashlib.sha256(b"fast").hexdigest()


def test_cli_export_command(study, tmp_path):
    from tuner.commands.cli import app

    out = tmp_path / "cli-out"
    result = CliRunner().invoke(app, ["export", "--gpu", "h100", "--variant", "mha", "--study-dir", str(study),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / H100_MHA).exists()


def test_a_varlen_record_is_its_own_key_file_and_config(tmp_path):
    """A varlen kernel of the same spec and bucket as a dense one: both stored, exported to two configs, the
    dense name unchanged and the varlen one saying its layout; the reader keeps them apart."""
    from hardware_profiles import load_profile

    from tuner.serving import read_configs

    store = KernelStore(tmp_path / "s")
    dense = make_record(bucket="s4096", cubin=b"dense")
    varlen = make_record(bucket="s4096", cubin=b"varlen", layout="varlen")
    assert store.offer(dense) and store.offer(varlen)
    assert {r.layout for r in store.records()} == {"dense", "varlen"}
    assert store.best("sm90", "mha", "bf16", 128, 128, True)["s4096"].cubin == b"dense"
    assert store.best("sm90", "mha", "bf16", 128, 128, True, "varlen")["s4096"].cubin == b"varlen"
    paths = export_records(store.records(), load_profile("h100"), tmp_path / "e")
    names = sorted(p.name for p in paths)
    assert names == ["variant=mha,head_dim=128,dtype=bf16,causal=1,device_name=NVIDIA_H100_80GB_HBM3.json",
                     "variant=mha,head_dim=128,dtype=bf16,causal=1,layout=varlen,device_name=NVIDIA_H100_80GB_HBM3.json"]
    layouts = {c.path.name: c.layout for c in read_configs(tmp_path / "e")}
    assert sorted(layouts.values()) == ["dense", "varlen"]
