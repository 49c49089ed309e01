"""One real local Ray cluster for the campaign tests: 2 CPUs and 2 fake H100 GPUs (label and resource),
started once per session (~5 s); other drivers (the kill -9 subprocess) and a second node join it by
address."""
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
GRID = FIXTURES / "h100_mha_d128_bf16_causal.jsonl.gz"
REPO = Path(__file__).resolve().parents[2]


# The spaces the recorded grids were measured in: their kernels are mma.sync ones on an H100, which Hopper's own
# spaces no longer offer (search_spaces/*.toml [arch.sm90] keeps the fa2 sketch on wgmma). A campaign replaying them
# reads this copy (search_spaces.SPACES_ENV); tests of the spaces themselves read the package's (test_space.py).
HOPPER_WGMMA_ONLY = 'mma_atom = ["SM90_GMMA"]\n'


@pytest.fixture(scope="session", autouse=True)
def recorded_spaces(tmp_path_factory):
    import shutil

    from search_spaces import SPACE_DIR, SPACES_ENV

    root = tmp_path_factory.mktemp("recorded_spaces")
    for src in [*SPACE_DIR.glob("*.toml"), *SPACE_DIR.glob("decode/*.toml")]:
        dst = root / src.relative_to(SPACE_DIR)
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        section = text.find("[arch.sm90]")
        if section >= 0:
            end = text.find("\n[", section + 1)
            end = len(text) if end < 0 else end
            text = text[:section] + text[section:end].replace(HOPPER_WGMMA_ONLY, "") + text[end:]
        dst.write_text(text)
    shutil.copystat(SPACE_DIR, root)
    before = os.environ.get(SPACES_ENV)
    os.environ[SPACES_ENV] = str(root)
    yield root
    if before is None:
        os.environ.pop(SPACES_ENV, None)
    else:
        os.environ[SPACES_ENV] = before


@pytest.fixture(scope="session")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=2, labels={"ray.io/accelerator-type": "H100"}, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", object_store_memory=200 * 1024 * 1024)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def campaign_seed_keys(gpu="h100", variant="mha", dtype="bf16", head_dim=None):
    """Keys of the seeds a campaign without an LLM endpoint enqueues first, in order: the per-spec default and the
    profile's per-bucket defaults, the search space's published choices, then the profile's stand-ins (driver._enqueue_seeds), each
    once and only if valid."""
    from hardware_profiles import load_profile
    from search_spaces import load_space
    from search_spaces.feasible import feasible_space
    from translate.params import KernelParams
    from tuner.llm import LLMConfig, propose_params
    from kernel_abi.spec import grid_problems, spec_for

    profile, space = load_profile(gpu), load_space(variant)
    spec = spec_for(variant, head_dim, dtype, True)
    problems = grid_problems(variant, spec.d_qk, dtype, True)
    fs = feasible_space(space, profile, spec.d_qk, dtype, problems)
    from tuner.campaign.driver import bucket_default_seeds, per_spec_default_seed

    offered = [(KernelParams(**{k: v for k, v in params.items() if k != "schedule"}), params["schedule"])
               for params, _, _ in per_spec_default_seed(profile, spec) + bucket_default_seeds(profile, spec)]
    for seed in space.seeds_for(spec.d_qk):
        raw = dict(seed.params)
        schedule = raw.pop("schedule", "fa2")
        offered.append((KernelParams(**raw), schedule))
    from translate.defaults import default_schedule

    offered.sort(key=lambda o: o[1] != default_schedule(profile))
    offered += [(s.params, "fa2") for s in propose_params(LLMConfig.from_options(None, None, None), profile, spec,
                                                          "", 8, None)]
    keys, by_key = [], {}
    for params, schedule in offered:
        _, problems_found = fs.project({**params.to_dict(), "schedule": schedule}, profile, spec.d_qk, dtype, problems)
        if not problems_found and params.key() not in keys:
            keys.append(params.key())
        by_key.setdefault(params.key(), params)
    return keys, by_key


def write_replay(path: Path, faults: dict) -> Path:
    """The recorded grid with ``faults`` (key -> fault) planted over the recorded entries."""
    from translate.params import KernelParams

    rows = [json.loads(line) for line in gzip.open(GRID, "rt")]
    out = []
    for r in rows:
        if "params" in r and KernelParams.from_dict(r["params"]).key() in faults:
            continue
        out.append(r)
    for key, (params, fault) in faults.items():
        out.append({"params": params.to_dict(), "fault": fault})
    path.write_text("\n".join(json.dumps(r) for r in out) + "\n")
    return path


def start_node(address: str, accel: str, gpus: int = 1) -> subprocess.Popen:
    """A second Ray node on loopback with a fake accelerator; stop it with stop_node (only this node)."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", f"--address={address}",
                             "--num-cpus=1", f"--num-gpus={gpus}", f"--labels=ray.io/accelerator-type={accel}",
                             "--block", "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def wait_for_node(accel: str, timeout: float = 60) -> str:
    import ray

    end = time.time() + timeout
    while time.time() < end:
        for n in ray.nodes():
            if n["Alive"] and (n.get("Labels") or {}).get("ray.io/accelerator-type") == accel:
                return n["NodeID"]
        time.sleep(0.5)
    raise TimeoutError(f"no {accel} node joined")


STUDY = "h100-mha-bf16-d128-causal"


def paced_grid(path: Path, seconds: float, faults: dict | None = None) -> Path:
    """The recorded grid with each replayed trial holding its GPU ``seconds`` (``_meta.measure_seconds``);
    ``faults`` ({params key: (KernelParams, fault)}) replace those rows with planted faults."""
    from translate.params import KernelParams

    faults = faults or {}
    rows = []
    for r in (json.loads(line) for line in gzip.open(GRID, "rt")):
        if "_meta" in r:
            r = {"_meta": dict(r["_meta"], measure_seconds=seconds)}
        elif KernelParams.from_dict(r["params"]).key() in faults:
            continue
        rows.append(r)
    rows += [{"params": p.to_dict(), "fault": f} for p, f in faults.values()]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def replay_options(study_dir, **changes):
    """A campaign on the session's fake-GPU cluster, replaying the recorded grid (a few trials, fast limits)."""
    from tuner.campaign import CampaignOptions

    base = dict(gpu="h100", variant="mha", trials=14, study_dir=Path(study_dir), backend=f"replay:{GRID}",
                compile_batch=2, trial_timeout=20.0, seed=3, live=False)
    base.update(changes)
    return CampaignOptions(**base)


def load_study(study_dir, name=STUDY, storage=None):
    import optuna

    from tuner.campaign.study import make_storage

    return optuna.load_study(study_name=name, storage=storage or make_storage(None, Path(study_dir), name))
