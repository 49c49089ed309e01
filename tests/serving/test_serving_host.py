"""A serving host needs torch, cuda-python and the exported folder: the runtime side imports nothing of
the campaign (optuna, ray, openai) nor of the tool's other dependencies, and serves a call without them."""
import subprocess
import sys
from pathlib import Path

from conftest import make_export

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("optuna", "ray", "openai", "rich", "typer", "lark", "jinja2", "pydantic", "matplotlib", "sqlalchemy")

SCRIPT = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"a serving host has no {{name}}")
        return None
sys.meta_path.insert(0, Block())
import torch
from tuner.serving import DeviceFacts, load_exported
from tuner import runtime, loader  # noqa: F401
import tuner.serving.hf  # noqa: F401
class K:
    def __call__(self, q, k, v, out=None, softmax_scale=None):
        from tuner.serving.sdpa import sdpa_attention
        return sdpa_attention(q, k, v, causal=True, softmax_scale=softmax_scale)
attn = load_exported({folder!r}, devices={{("cpu", None): DeviceFacts("NVIDIA H100 80GB HBM3", (9, 0))}},
                     kernel_loader=lambda c, m, d: K())
q = torch.randn(1, 64, 4, 128).to(torch.bfloat16)
attn(q, q, q, causal=True)
assert attn.last_path == "kernel", attn.last_reason
print("served", sorted(m for m in BLOCKED if m in sys.modules))
"""


def test_the_runtime_side_imports_nothing_of_the_campaign(tmp_path):
    folder = make_export(tmp_path / "export")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(blocked=BLOCKED, folder=str(folder))], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "served []" in proc.stdout
