"""Compiled transformers models timed each in a process of its own, paired in time (scripts/bench_serving.py
--family).

Why: compiled in one process, a model of ours ran at 11.3 ms (gpt-oss-shaped) and 16.3 ms (Gemma-2-shaped) right
after its compile and at 17.3 / 22.9 ms once transformers' eager and flex-attention models had been compiled in the
same process, its profile then in ATen's eager kernels around the attention (BENCHMARKS.md, the gpt-oss- and
Gemma-2-shaped models): the one-process ratio measures that interaction, not the models. Reproduced on the CPU
(a tiny Gemma-2, stand-in kernels): the three models share transformers' decorator frame (utils/generic.py
``wrapper``), whose Dynamo cache then holds an entry per model; the flex-attention model's, compiled last and checked
first, graph-breaks early with guards that our model's calls pass too, so ours runs that entry and resumes in frames
compiled for flex's path (RMSNorm, rotary and the logit cap in ATen's eager ops) instead of its own full graph.
Here each implementation's model is built from the same seed, compiled and warmed in its own worker process on the
same GPU; the parent then asks the workers in turn for a round of forwards (the order flipped every round), so the
rounds of ours and of a baseline alternate in time as the one-process paired rounds do, and no process holds
another's compiled code.

``paired_rounds`` is the pairing, given any round-timing callables (a test drives it without a GPU; the caller judges
the rounds);
``WorkerPool`` is the process plumbing; ``family_model`` builds a family's model (transformers imported there).
"""
from __future__ import annotations

import multiprocessing
import statistics
from typing import Callable


# scripts/bench_serving.py's option-model families: the transformers classes of each
FAMILY_CLASSES = {"gpt-oss": ("GptOssForCausalLM", "GptOssConfig"), "gemma2": ("Gemma2ForCausalLM", "Gemma2Config")}


def family_model(family: str, config: dict, attn_implementation: str, state=None, device: str = "cuda"):
    """``family``'s transformers model of ``config`` on ``device`` in bf16, eval mode, with ``state``'s weights or
    (None) the current seed's; gpt-oss's sinks drawn from N(0, 2) (they start at zero, where they would not matter)."""
    import torch
    import transformers

    model_name, config_name = FAMILY_CLASSES[family]
    cls = getattr(transformers, model_name)
    conf = getattr(transformers, config_name)(**config)
    model = cls._from_config(conf, attn_implementation=attn_implementation).to(device, torch.bfloat16).eval()
    if state is not None:
        model.load_state_dict(state)
    elif family == "gpt-oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(std=2.0)
    return model


def paired_rounds(time_round: dict[str, Callable[[int], float]], ours: str, other: str, rounds: int,
                  reps: int = 4) -> tuple[list[float], list[float]]:
    """Ours against ``other``, round by round: a round asks each for the median ms of ``reps`` forwards, ours first
    in even rounds and second in odd ones. -> (ours' ms, other's ms) a round, for the caller's verdict (an odd count
    of rounds: the median ratio is one round's)."""
    if rounds < 3 or rounds % 2 == 0:
        raise ValueError(f"rounds must be an odd count >= 3 (the median ratio is then one round's), got {rounds}")
    ours_ms, other_ms = [], []
    for r in range(rounds):
        order = (ours, other) if r % 2 == 0 else (other, ours)
        got = {name: time_round[name](reps) for name in order}
        ours_ms.append(got[ours])
        other_ms.append(got[other])
    return ours_ms, other_ms


def _worker(conn, family: str, config: dict, implementation: str, export_dir: str | None, shapes: list,
            device: str = "cuda") -> None:
    """One implementation's model, compiled (fullgraph for ours) and warmed at every shape; then answers
    ("time", shape index, reps) with the median ms of reps forwards, ("logits", shape index) with the last row's
    first 256 logits, and ("stop",). Any failure is sent back as ("error", text). Timed by CUDA events on a GPU, by
    the host clock on the CPU (the plumbing's test)."""
    try:
        import time

        import torch

        name = implementation
        if export_dir is not None:
            from tuner.serving import load_exported
            from tuner.serving.hf import register_transformers

            attn = load_exported(export_dir)
            name = register_transformers(attn)
        torch.manual_seed(0)
        model = family_model(family, config, name, device=device)
        fn = torch.compile(model, fullgraph=export_dir is not None)
        vocab = min(1000, int(config["vocab_size"]))
        inputs = [torch.randint(0, vocab, (b, s), device=device, generator=torch.Generator(device=device).manual_seed(s))
                  for b, s in shapes]
        with torch.no_grad():
            for ids in inputs:
                for _ in range(3):
                    fn(ids)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        stats = dict(attn.stats) if export_dir is not None else {}
        reasons = dict(attn.reasons) if export_dir is not None else {}
        conn.send(("ready", {"stats": stats, "reasons": reasons}))
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            ids = inputs[message[1]]
            with torch.no_grad():
                if message[0] == "logits":
                    conn.send(("logits", fn(ids).logits[0, -1, :256].float().cpu().tolist()))
                    continue
                times = []
                for _ in range(message[2]):
                    if device != "cuda":
                        start = time.perf_counter()
                        fn(ids)
                        times.append((time.perf_counter() - start) * 1e3)
                        continue
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn(ids)
                    end.record()
                    sync()
                    times.append(start.elapsed_time(end))
            conn.send(("time", statistics.median(times)))
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        conn.send(("error", f"{type(exc).__name__}: {str(exc)[:300]}"))


class WorkerPool:
    """One worker process per implementation (``ours`` reads the export in ``export_dir``), all started at once."""

    def __init__(self, family: str, config: dict, implementations: list[str], ours: str, export_dir: str | None,
                 shapes: list, device: str = "cuda"):
        context = multiprocessing.get_context("spawn")
        self.conns, self.procs, self.ready, self.errors = {}, {}, {}, {}
        for name in implementations:
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, family, config, name,
                                                         export_dir if name == ours else None, shapes, device),
                                   daemon=True)
            proc.start()
            self.conns[name], self.procs[name] = parent, proc
        for name, conn in self.conns.items():
            try:
                kind, payload = conn.recv()
            except EOFError:   # the worker died without a word (its exit code says how)
                self.procs[name].join(timeout=10)
                kind, payload = "error", f"worker exited with code {self.procs[name].exitcode}"
            (self.ready if kind == "ready" else self.errors)[name] = payload

    def timer(self, name: str, shape_index: int) -> Callable[[int], float]:
        def time_round(reps: int) -> float:
            self.conns[name].send(("time", shape_index, reps))
            kind, payload = self.conns[name].recv()
            if kind != "time":
                raise RuntimeError(f"{name}: {payload}")
            return payload
        return time_round

    def logits(self, name: str, shape_index: int) -> list[float]:
        self.conns[name].send(("logits", shape_index))
        kind, payload = self.conns[name].recv()
        if kind != "logits":
            raise RuntimeError(f"{name}: {payload}")
        return payload

    def close(self) -> None:
        for name, conn in self.conns.items():
            if name in self.ready:
                conn.send(("stop",))
        for proc in self.procs.values():
            proc.join(timeout=60)


def compiled_apart(family: str, config: dict, baselines: tuple, export_dir: str, shapes: list, rounds: int,
                   summary: Callable[[list[float], list[float]], dict]) -> dict:
    """Per shape: ours against each baseline, every model compiled in its own process (module doc), the rounds
    judged by ``summary`` (ours' ms, the baseline's ms -> a dict); the first 256 logits of each model's last row
    against ours' (the same seed builds the same weights)."""
    ours = "ours"
    pool = WorkerPool(family, config, [ours, *baselines], ours, export_dir, shapes)
    try:
        result = {"errors": dict(pool.errors), "ours_calls": pool.ready.get(ours), "shapes": []}
        if ours not in pool.ready:
            return result
        for index, (b, s) in enumerate(shapes):
            row = {"shape": f"b{b} s{s}", "against": {}}
            mine = pool.logits(ours, index)
            for name in baselines:
                if name not in pool.ready:
                    continue
                theirs = pool.logits(name, index)
                ours_ms, their_ms = paired_rounds({ours: pool.timer(ours, index), name: pool.timer(name, index)},
                                                  ours, name, rounds)
                row["against"][name] = {**summary(ours_ms, their_ms), "ms": {ours: statistics.median(ours_ms),
                                                                             name: statistics.median(their_ms)},
                                        "max_abs_logit_diff": max(abs(x - y) for x, y in zip(mine, theirs))}
            result["shapes"].append(row)
        return result
    finally:
        pool.close()
