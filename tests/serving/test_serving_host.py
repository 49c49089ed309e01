"""The runtime has a floor: a serving host needs torch, cuda-python and the exported folder. Every module of
tuner.serving (the op, the drop-ins, the transformers integration, the launchers, the bucket rules, decode and
appending included) imports, from this project, only tuner.serving itself and the shared facts of kernel_abi: never
the compiler (translate, tl), the campaign, the commands, the measurement library, the store or the export, nor the
tool's third-party dependencies (optuna, ray, openai...). With all of those blocked, it loads an export and serves a
prefill and a decode call."""
import subprocess
import sys
from pathlib import Path

from conftest import make_export
from store_fakes import make_decode_record, make_record

REPO = Path(__file__).resolve().parents[2]
THIRD_PARTY = ("optuna", "ray", "openai", "rich", "typer", "lark", "jinja2", "pydantic", "matplotlib", "sqlalchemy",
               "cmaes")
OURS = ("translate", "tl", "search_spaces", "hardware_profiles", "tuner")   # tuner: all but tuner.serving
ALLOWED = ("tuner", "tuner.serving", "kernel_abi")

SCRIPT = """
import importlib, importlib.abc, pkgutil, sys
THIRD_PARTY, OURS, ALLOWED = {third_party!r}, {ours!r}, {allowed!r}
refused = []
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        allowed = any(name == a or name.startswith(a + ".") for a in ALLOWED if a != "tuner") or name == "tuner"
        if top in THIRD_PARTY or (top in OURS and not allowed):
            refused.append(name)
            raise ImportError(f"a serving host has no {{name}}")
        return None
sys.meta_path.insert(0, Block())
import torch
import tuner.serving
names = [m.name for m in pkgutil.walk_packages(tuner.serving.__path__, "tuner.serving.")]
for name in names:
    importlib.import_module(name)
print("modules", len(names))

from tuner.serving import DeviceFacts, load_exported
sys.path.insert(0, {tests!r})
from conftest import stand_in_loader
attn = load_exported({folder!r}, devices={{("cpu", None): DeviceFacts("NVIDIA H100 80GB HBM3", (9, 0))}},
                     kernel_loader=stand_in_loader)
q = torch.randn(1, 64, 8, 128).to(torch.bfloat16)
k = torch.randn(1, 64, 2, 128).to(torch.bfloat16)
attn(q, k, k, causal=True)
assert attn.last_path == "kernel", attn.last_reason
pages = torch.randn(4, 16, 2, 128).to(torch.bfloat16)
table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
o = attn.flash_attn_with_kvcache(q[:, :1], pages, pages, cache_seqlens=torch.tensor([50], dtype=torch.int32),
                                 block_table=table, causal=True)
assert attn.last_path == "kernel", attn.last_reason
assert o.shape == (1, 1, 8, 128)
print("served", refused)
"""


def test_the_runtime_imports_only_itself_and_the_shared_facts_and_serves_prefill_and_decode(tmp_path):
    records = [make_record(variant="gqa", bucket="s1024", cubin=b"prefill"),
               make_decode_record(bucket="d-b8-kv8k-p16", cubin=b"decode")]
    for r in records:
        r.kernel_meta["spec"] = {"causal": r.causal, "d_qk": r.d_qk, "d_v": r.d_v, "dtype": r.dtype,
                                 "layout": r.layout}
    folder = make_export(tmp_path / "export", records)
    script = SCRIPT.format(third_party=THIRD_PARTY, ours=OURS, allowed=ALLOWED, folder=str(folder),
                           tests=str(Path(__file__).resolve().parent))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = int(proc.stdout.split("modules ")[1].split()[0])
    assert modules >= 25                      # the walk found the runtime's modules (launch/ and buckets/ included)
    assert "served []" in proc.stdout, proc.stdout
