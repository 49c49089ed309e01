"""Building kernels from the command line's view: the GPU profile and kernel spec of a target, the checked sketch,
the parameters (``--params`` over a default), then translate and nvcc. The commands (`tune build`, `tune bench`)
and the default export build through here; the campaign builds through its own tasks."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hardware_profiles import Profile, ProfileError, load_profile
from kernel_abi.spec import KernelSpec, fp8_layout_errors, spec_for


class UsageError(ValueError):
    """Bad command-line input (exit 2)."""


def parse_params_arg(text: Optional[str], base):
    """``--params``: a JSON object, or a file holding one; fields not given keep the base's values. The result is of
    the base's class (KernelParams, or translate.decode.DecodeParams for a decode kernel)."""
    if text is None:
        return base
    stripped = text.strip()
    if stripped.startswith("{"):
        source, raw = "--params", stripped
    else:
        path = Path(text)
        if not path.is_file():
            raise UsageError(f"--params {text!r} is neither a JSON object nor a file")
        try:
            source, raw = str(path), path.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --params file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("params"), dict):
        data = data["params"]  # accept a build/bench/export JSON as is
    if not isinstance(data, dict):
        raise UsageError(f"{source}: kernel parameters must be a JSON object, got {type(data).__name__}")
    try:
        return type(base).from_dict({**base.to_dict(), **data})
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{source}: {exc}") from None


@dataclass(frozen=True)
class ModelOptions:
    """The attention options of ``--window L,R``, ``--softcap X`` and ``--sinks`` (kernel_abi.spec's
    conventions: the window in keys left and right of the diagonal, -1 open; a causal target closes the right side
    at 0)."""

    window: tuple = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False

    def window_for(self, causal: bool) -> tuple:
        return (self.window[0], 0 if causal and self.window != (-1, -1) else self.window[1])

    def problem_changes(self, causal: bool) -> dict:
        """Problem.with_ changes for a problem of this causality."""
        return {"window": self.window_for(causal), "softcap": self.softcap, "sinks": self.sinks}

    def spec_changes(self, causal: bool) -> dict:
        from kernel_abi.spec import is_local

        return {"local": is_local(self.window_for(causal), causal), "softcap": self.softcap > 0,
                "sinks": self.sinks}


NO_OPTIONS = ModelOptions()


def parse_options(window: Optional[str], softcap: Optional[float], sinks: bool) -> ModelOptions:
    """``--window L,R`` (ints >= -1, -1 open), ``--softcap X`` (> 0), ``--sinks``; UsageError naming the flag."""
    import math

    from kernel_abi.spec import window_errors

    pair = (-1, -1)
    if window is not None:
        try:
            pair = tuple(int(x) for x in window.replace(" ", "").split(","))
        except ValueError:
            raise UsageError(f"--window must be L,R (keys left and right of the diagonal, -1: open), got {window!r}") \
                from None
        errors = window_errors(pair, False) if len(pair) == 2 else ["it needs two numbers"]
        if errors or pair == (-1, -1):
            raise UsageError(f"--window {window}: " + ("; ".join(errors) or "-1,-1 is no window"))
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise UsageError(f"--softcap must be a positive number (the cap of the scores), got {softcap}")
    return ModelOptions(pair, float(softcap or 0.0), bool(sinks))


def resolve_target(gpu: str, variant: str, head_dim: Optional[int], dtype: Optional[str],
                   causal: bool, layout: str = "dense", options: ModelOptions = NO_OPTIONS
                   ) -> tuple[Profile, KernelSpec]:
    """Profile and kernel spec from the command line; UsageError naming the choices when one is wrong."""
    import dataclasses

    from tl.layout import LAYOUTS

    try:
        profile = load_profile(gpu)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    try:
        spec = spec_for(variant, head_dim, dtype or profile.default_dtype, causal)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if spec.dtype not in profile.dtypes:
        raise UsageError(f"{profile.name} does not support {spec.dtype}; choose one of: {', '.join(profile.dtypes)}"
                         + (" (fp8 kernels are Hopper kernels)" if spec.dtype == "fp8" else ""))
    if spec.dtype == "fp8" and fp8_layout_errors(layout):
        raise UsageError(f"--dtype fp8: {fp8_layout_errors(layout)[0]}")
    if spec.dtype == "fp8" and any(options.spec_changes(causal).values()):
        raise UsageError("--dtype fp8 kernels take no --window, --softcap or --sinks")
    return profile, dataclasses.replace(spec, layout=layout, **options.spec_changes(causal))


def resolve_schedule(schedule: Optional[str], profile: Profile) -> str:
    """``--schedule``: a reference sketch set (tl.SCHEDULES); default: the profile's (Hopper's own on sm90)."""
    import tl
    from translate.defaults import default_schedule

    if schedule is None:
        return default_schedule(profile)
    if schedule not in tl.SCHEDULES:
        raise UsageError(f"unknown schedule {schedule!r}; choose one of: {', '.join(tl.SCHEDULES)}")
    return schedule


def read_sketch(path: Path) -> str:
    """A sketch file's text. A file that cannot be read as text (missing, a directory, unreadable, not UTF-8) is
    an I/O error: UsageError naming the file and why (exit 2, as `tune check` answers it). A file read but holding
    no program (empty, only comments) is an invalid sketch, which the checker's diagnostics report (exit 1)."""
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "a directory, not a TL file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read sketch {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"cannot read sketch {path}: {exc.strerror or exc}") from None


def load_checked_program(variant: str, causal: bool, sketch: Optional[Path], schedule: str = "fa2",
                         layout: str = "dense", spec: Optional[KernelSpec] = None):
    """(program, source text, path label, diagnostics). The built-in reference sketch of ``schedule`` in
    ``layout`` when no file is given, with the statements of ``spec``'s options (tl/options.py: a window, a cap,
    sinks) added; a sketch file states them itself."""
    import tl

    if sketch is None:
        text = tl.load_sketch(variant, causal, schedule, layout)
        features = getattr(spec, "features", ())
        if features:
            from tl.options import with_options

            text = tl.format_program(with_options(tl.parse_program(text), "local" in features, "softcap" in features,
                                                  "sinks" in features))
        label = f"<reference {schedule} {variant} {'causal' if causal else 'noncausal'}" + \
            (f" {layout}" if layout != "dense" else "") + "".join(f" {f}" for f in features) + ">"
    else:
        text, label = read_sketch(Path(sketch)), str(sketch)
    program, diagnostics = tl.check_source(text, label)
    return program, text, label, list(diagnostics)


@dataclass(frozen=True)
class BuiltKernel:
    """One kernel built for a spec: its parameters, the translator's output and nvcc's."""

    spec: object
    params: object
    kernel: object          # GeneratedKernel
    compiled: object        # CompileResult
    seqlens: Optional[tuple[int, ...]] = None   # the seqlens this kernel serves (a bucket default's); None: all


def build_kernels(targets, variant, params, sketch, profile, err, cache_dir, schedule: str = "fa2",
                   seqlens: Optional[Sequence[int]] = None, page_size: Optional[int] = None):
    """Translate and compile one kernel per (spec) in one batched nvcc call, each from the reference sketch of
    its spec's layout unless a sketch file is given. With neither --params nor a sketch file and ``seqlens``
    given, a warp-specialised dense spec gets one kernel per distinct bucket default of those seqlens
    (tuner/defaults/table.py), each serving its own seqlens. ``page_size``: a paged spec's default is the one for
    that page size (translate.defaults.WHOLE_TILE_PAGES). (built, exit code)."""
    import translate
    from translate import nvcc
    from translate.defaults import default_params, probe_problem
    from translate.params import validate
    from tl.pipelines import has_roles
    from tuner.defaults.table import applies_to, group_by_params

    pending = []
    for prof, spec in targets:
        try:
            program, _, label, diagnostics = load_checked_program(variant, spec.causal, sketch, schedule,
                                                                  spec.layout, spec)
            warp_specialized = program is not None and has_roles(program.statements)
            kp = parse_params_arg(params, default_params(prof, spec, "ws_overlap" if warp_specialized else "fa2",
                                                         page_size=page_size))
            groups = [(kp, None)]
            if (params is None and sketch is None and seqlens is not None and warp_specialized
                    and applies_to(spec, "ws_overlap")):
                grouped = group_by_params(prof, spec, seqlens)
                groups = [(g, tuple(s)) for g, s in grouped] if len(grouped) > 1 else [(grouped[0][0], None)]
        except UsageError as exc:
            err.print(f"tune bench: error: {exc}", markup=False, highlight=False)
            return None, 2
        except ValueError as exc:   # no default fits the profile, or a bucket table it refuses (BucketTableError)
            err.print(f"tune bench: error: {exc}", markup=False, highlight=False)
            return None, 1
        if diagnostics or program is None:
            for d in diagnostics:
                err.print(str(d), markup=False, highlight=False)
            return None, 1
        for kp, served in groups:
            reasons = validate(kp, prof, probe_problem(spec), warp_specialized=warp_specialized)
            if reasons:
                err.print(f"parameters {kp.key()} are not legal for {spec.label()}: " + "; ".join(reasons),
                          markup=False)
                return None, 1
            try:
                pending.append((spec, kp, translate.generate(program, kp, prof, spec), served))
            except translate.TranslationError as exc:
                err.print(f"translation failed for {spec.label()}: {exc}", markup=False, highlight=False)
                return None, 1
    compiled = nvcc.compile_kernels([k for _, _, k, _ in pending], profile.nvcc_arch,
                                    cache_dir=cache_dir or nvcc.default_cache_dir())
    for (spec, _, k, _), res in zip(pending, compiled):
        if not res.ok:
            err.print(res.log[-3000:], markup=False, highlight=False)
            err.print(f"nvcc: {res.error_kind} for {k.name}", markup=False)
            return None, 2 if res.error_kind == "nvcc-missing" else 1
    return [BuiltKernel(spec, kp, k, res, served) for (spec, kp, k, served), res in zip(pending, compiled)], 0
