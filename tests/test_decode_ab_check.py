"""scripts/decode_ab_check.py's pairing of two `tune build --phase decode` folders, on the CPU: by file name, or
with --by-spec by the kernels' spec (two parameter choices of one problem have different names)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import decode_ab_check as ab  # noqa: E402

MLA = {"variant": "mla", "d_qk": 576, "d_v": 512, "causal": True, "dtype": "bf16", "layout": "paged"}


def record(folder: Path, name: str, spec: dict) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"meta": {"name": name, "spec": spec}}))
    return path


def test_same_names_pair_by_name(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a, "k_wg", MLA), record(b, "k_wg", MLA), record(b, "k_other", MLA)
    assert [(x.name, y.name) for x, y in ab.pair_records(a, b)] == [("k_wg.json", "k_wg.json")]


def test_by_spec_pairs_different_names_of_one_spec(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a, "k_wg", MLA), record(a, "k_gqa", {**MLA, "variant": "gqa", "d_qk": 128, "d_v": 128})
    record(b, "k_ss", MLA)
    assert ab.pair_records(a, b) == []
    assert [(x.name, y.name) for x, y in ab.pair_records(a, b, by_spec=True)] == [("k_wg.json", "k_ss.json")]


def test_by_spec_refuses_a_folder_with_two_kernels_of_one_spec(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record(a, "k_wg", MLA), record(a, "k_wg2", MLA), record(b, "k_ss", MLA)
    with pytest.raises(SystemExit, match="two kernels of one spec"):
        ab.pair_records(a, b, by_spec=True)
