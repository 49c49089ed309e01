"""`tune defaults`: a GPU's bucket-defaults table from the campaigns of a study dir (tuner/defaults/derive.py).

Writes ``<gpu>.toml`` where `tune build`, `tune bench`, the default export and campaigns' seeds read tables
(hardware_profiles/bucket_defaults/, or $TUNER_BUCKET_TABLES), or ``-o FILE``; the campaigns' records go beside it
(``records/<gpu>/campaign-<study>.json``) so the table can be derived again from them.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Optional

from rich.console import Console

from kernel_abi.spec import KernelSpec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def run_defaults(gpu: str, study_dir: Path, out: Optional[Path] = None, force: bool = False,
                 console: Optional[Console] = None) -> int:
    """0 written (or printed with ``-o -``); 1 the study dir holds no campaign of the GPU that can give a table, or a
    derived change the profile refuses; 2 bad input (an unknown GPU, a study dir that is not one, a table that
    would be replaced without --force, an output that cannot be written)."""
    from hardware_profiles import ProfileError, load_profile
    from translate.defaults import default_params
    from translate.params import KernelParams
    from tuner.defaults.derive import DeriveError, derive, read_results, render
    from tuner.defaults.table import TABLE_DIR, BucketTableError, changed_params, parse_table, tables_dir

    console = console or Console()
    err = Console(stderr=True, soft_wrap=True)

    def fail(message: str, code: int) -> int:
        err.print(f"tune defaults: error: {message}", markup=False, highlight=False)
        return code

    try:
        profile = load_profile(gpu)
    except ProfileError as exc:
        return fail(str(exc), 2)
    to_stdout = out is not None and str(out) == "-"
    target = None if to_stdout else (Path(out) if out is not None else (tables_dir() or TABLE_DIR) / f"{profile.name}.toml")
    if target is not None and out is None and target.exists() and not force:
        return fail(f"{target} exists (the table `tune build` and `tune bench` read for {profile.name}): pass --force "
                    "to replace it, or -o FILE to write elsewhere", 2)
    try:
        results = read_results(study_dir)
    except DeriveError as exc:
        return fail(f"--study-dir {exc}", 2)

    def default_for(spec) -> dict:
        return {k: v for k, v in default_params(profile, spec, "ws_overlap").to_dict().items() if k != "schedule"}

    derivation = derive(results, profile.name, default_for, field_defaults=KernelParams().to_dict())
    if not derivation.records:
        return fail(f"no campaign of {profile.name} in {study_dir} with the fields a table needs (dense prefill "
                    f"campaigns write them: tune --gpu {profile.name} --variant mha --study-dir {study_dir})", 1)
    for entry in derivation.entries:
        spec = KernelSpec(entry.variant, entry.head_dim, entry.head_dim, entry.causal, entry.dtype or "bf16")
        _, reasons = changed_params(profile, spec, dict(entry.change))
        if reasons:
            return fail(f"{spec.label()} {','.join(entry.buckets)}: the change {dict(entry.change)} is not legal on "
                        f"{profile.name}: {'; '.join(reasons)}", 1)
    records_dir = (target.parent if target is not None else Path(".")) / "records" / profile.name
    # named from the table's folder, so that a table and its records move (and are committed) together
    shown = str(records_dir) if target is None else os.path.relpath(records_dir, target.parent)
    text = render(derivation, profile.name, str(study_dir), datetime.date.today().isoformat(), shown)
    try:
        parse_table(tomllib.loads(text), str(target or "<stdout>"))
    except (tomllib.TOMLDecodeError, BucketTableError) as exc:   # a bug here, never a wrong table written
        return fail(f"the derived table does not read back: {exc}", 1)
    if to_stdout:
        sys.stdout.write(text)          # as is: a console would wrap its long lines
        return 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        records_dir.mkdir(parents=True, exist_ok=True)
        for record in derivation.records:
            name = f"campaign-{record.get('study') or 'study'}.json"
            (records_dir / name).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        target.write_text(text)
    except OSError as exc:
        return fail(f"cannot write {target}: {exc.strerror or exc}", 2)
    changed = sum(len(e.buckets) for e in derivation.entries)
    console.print(f"{target}: {len(derivation.entries)} change(s) over {changed} bucket(s) from "
                  f"{len(derivation.records)} campaign(s); records in {records_dir}", markup=False, highlight=False)
    for entry in derivation.entries:
        console.print(f"  {entry.variant} d{entry.head_dim} {'causal' if entry.causal else 'non-causal'} "
                      f"{','.join(entry.buckets)}: {dict(entry.change)} ({entry.measured()})",
                      markup=False, highlight=False)
    for note in derivation.notes:
        console.print(f"  left out: {note}", markup=False, highlight=False)
    read_here = (tables_dir() or TABLE_DIR).resolve()
    if target.resolve().parent == read_here and target.name == f"{profile.name}.toml":
        console.print(f"tune build --seqlen, tune bench, the default export and campaign seeds for {profile.name} "
                      "use it from now on",
                      markup=False, highlight=False)
    else:
        console.print(f"to use it: TUNER_BUCKET_TABLES={target.parent} (a folder of <gpu>.toml tables)"
                      + ("" if target.name == f"{profile.name}.toml" else f", the file named {profile.name}.toml"),
                      markup=False, highlight=False)
    return 0
