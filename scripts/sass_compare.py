"""Does a translator change change the kernels' SASS? Builds the same Hopper candidates from two git revisions
and compares each kernel's SASS (cuobjdump, translate.sass.sass_instructions: instructions without addresses
and encodings), registers and spills.

    python3 scripts/sass_compare.py BEFORE AFTER [--count 6] [--seed 7]       # e.g. HEAD~1 HEAD; nvcc, no GPU

The candidates: the MHA d128 causal bf16 default and three neighbours (scripts/compile_cost.py), then
``--count`` warp-specialised points of the valid space (a seeded draw). Each revision is exported with
``git archive`` into a temporary folder and imported from there, so the working tree is not touched. Prints
one line per kernel: identical, or the instruction counts and the opcodes whose counts differ.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run inside each exported revision (``python -c`` from its folder: the folder comes first on sys.path, before the
# installed package): its translator writes the kernels, nvcc builds each alone. The imports fall back to where
# revisions before the package layout of kernel_abi/ and translate/sass.py kept the same names.
BUILD = r"""
import json, random, sys
from pathlib import Path
import tl, translate
from hardware_profiles import load_profile
from search_spaces import load_space
from search_spaces.feasible import default_sketches, feasible_space
from translate import nvcc
try:
    from translate import sass
except ImportError:
    sass = nvcc
from translate.defaults import hopper_params
from translate.params import KernelParams
try:
    from kernel_abi.spec import grid_problems, spec_for
except ImportError:
    from tuner.problem import grid_problems, spec_for
count, seed, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
p, spec = load_profile("h100"), spec_for("mha", 128, "bf16", True)
base = hopper_params(p, spec).to_dict()
ws = tl.parse_program(tl.load_sketch("mha", True, "ws_overlap"))
kernels = [translate.generate(ws, KernelParams.from_dict({**base, **c}), p, spec) for c in
           ({}, {"block_n": 96}, {"pingpong": True}, {"pv_operand": "ss", "persistent": False})]
space = load_space("mha")
fs = feasible_space(space, p, 128, "bf16", grid_problems("mha", 128, "bf16", True), default_sketches(space, p, 128, "bf16"))
points = random.Random(seed).sample([pt for pt in fs.points if pt.sketch.startswith("ws_")], count)
kernels += [translate.generate(tl.parse_program(tl.load_sketch("mha", True, pt.sketch)), pt.params, p, spec) for pt in points]
rows = []
for k in kernels:
    r = nvcc.compile_kernel(k, p.nvcc_arch, timeout=600)
    cubin = out / f"{k.name}.cubin"
    cubin.write_bytes(r.cubin or b"")
    rows.append({"name": k.name, "ok": r.ok, "registers": r.registers, "spill_stores": r.spill_stores,
                 "sass": sass.sass_instructions(cubin)[k.name] if r.ok else None})
print(json.dumps(rows))
"""


def build(rev: str, count: int, seed: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="sass-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        tree.mkdir()
        out.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        run = subprocess.run([sys.executable, "-c", BUILD, str(count), str(seed), str(out)], cwd=tree,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{rev}: {run.stderr[-3000:]}")
        return json.loads(run.stdout.strip().splitlines()[-1])


def opcode(line: str) -> str:
    words = line.rstrip(";").split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", metavar="BEFORE", help="a git revision (commit, branch, tag)")
    ap.add_argument("after", metavar="AFTER", help="a git revision")
    ap.add_argument("--count", type=int, default=6, help="sampled warp-specialised points besides the four fixed ones")
    ap.add_argument("--seed", type=int, default=7, help="the draw of those points")
    args = ap.parse_args(argv)
    before, after = build(args.before, args.count, args.seed), build(args.after, args.count, args.seed)
    same = 0
    for a, b in zip(before, after):
        if not (a["ok"] and b["ok"]):
            print(f"{a['name']}: did not build ({args.before}: {a['ok']}, {args.after}: {b['ok']})")
            continue
        if a["sass"] == b["sass"]:
            same += 1
            print(f"{a['name']}: identical SASS ({len(a['sass'])} instructions, {a['registers']} registers)")
            continue
        ca, cb = Counter(map(opcode, a["sass"])), Counter(map(opcode, b["sass"]))
        delta = {op: cb[op] - ca[op] for op in sorted(set(ca) | set(cb)) if ca[op] != cb[op]}
        print(f"{a['name']}: {len(a['sass'])} -> {len(b['sass'])} instructions, registers {a['registers']} -> "
              f"{b['registers']}, spill stores {a['spill_stores']} -> {b['spill_stores']}; opcode counts {delta}")
    print(f"{same} of {len(before)} kernels identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
