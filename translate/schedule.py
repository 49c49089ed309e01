"""Dependency pass: where cp.async waits and __syncthreads() go, derived from the dataflow.

The program order is the schedule; this pass only adds the synchronisation that order needs. It
runs the lowered program symbolically (loops for a few iterations, if-bodies taken, every cp.async
copy committing one group as the emitted code does) and tracks, per shared buffer slot:

* RAW: an op that reads a slot filled by cp.async group g waits with ``cp_async_wait<n>`` where n is
  the number of groups committed after g (later prefetches may stay in flight), then needs a barrier
  so that every thread's part of the tile is visible;
* WAR: an op that writes a slot that was read since the last barrier needs a barrier first (the
  prefetch of K(i+1) into the K buffer after GEMM1 read K(i) from it).

Ring buffers (kv_stages > 1): a buffer written inside a loop has ``stages`` slots; the slot of a
write is its TL tile coordinate mod stages, a read uses the slot of the latest write. The tile a read
sees is fitted as ``a*i + b`` over the simulated iterations, so the emitter can index the ring.
Requirements found in any iteration hold for all (a loop body is emitted once): they take effect at
once, and the simulation is repeated with them until nothing new appears.
An if-body's waits and barriers are not relied upon after the if (it may be skipped: the last KV
iteration skips the prefetch); its copies commit groups on both paths (empty ones when skipped).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from translate.ir import Cond, Loop, Op, expr_eval, iter_ops
from translate.kernel import TranslationError

SIM_ITERATIONS = 5          # enough to reach the steady state of a 3-stage ring
SIM_LOOP_STOP = 1000        # symbolic loop bounds evaluate as "far away" during the simulation


@dataclass
class _Slot:
    group: int | None = None        # cp.async group of the latest write still in flight
    writer: int = 0                 # TL line of that write
    local: bool = False             # written (complete for the writer) but not yet behind a barrier
    read_since_barrier: bool = False


@dataclass
class _State:
    committed: int = 0
    slots: dict = field(default_factory=dict)          # (buffer, slot) -> _Slot
    last_tile: dict = field(default_factory=dict)      # buffer -> tile coordinate of the latest write

    def slot(self, key) -> _Slot:
        return self.slots.setdefault(key, _Slot())


class _Sim:
    def __init__(self, stages: dict[str, int], symbols: dict[str, int]):
        self.stages = stages
        self.symbols = symbols
        self.st = _State()
        self.changed = False            # a wait or barrier was added during this run
        self.reasons: dict[int, list[str]] = {}
        self.read_points: dict[tuple[int, str], list[tuple[tuple, int]]] = {}

    def _slot_of(self, buffer: str, tile: int) -> tuple[str, int]:
        return (buffer, tile % self.stages.get(buffer, 1))

    def _wait(self, n: int) -> None:
        done_below = self.st.committed - n
        for s in self.st.slots.values():
            if s.group is not None and s.group < done_below:
                s.group, s.local = None, True

    def _barrier(self) -> None:
        for s in self.st.slots.values():
            s.local = False
            s.read_since_barrier = False

    def _merge_skipped(self, skipped: _State) -> None:
        for key, old in skipped.slots.items():
            s = self.st.slot(key)
            if old.group is not None and (s.group is None or s.group < old.group):
                s.group, s.writer = old.group, old.writer   # still in flight on the skipped path
            s.local = s.local or old.local
            s.read_since_barrier = s.read_since_barrier or old.read_since_barrier

    def run(self, nodes, env: dict[str, int], loop_vars: tuple) -> None:
        for node in nodes:
            if isinstance(node, Op):
                self.op(node, env, loop_vars)
            elif isinstance(node, Loop):
                start = expr_eval(node.start, {**self.symbols, **env}, node.stmt.line) if node.start else 0
                for it in range(SIM_ITERATIONS):
                    self.run(node.body, {**env, node.var: start + it}, loop_vars + (node.var,))
            elif isinstance(node, Cond):
                # Both paths: the body's copies commit groups either way (empty ones when not taken),
                # but its waits and barriers only happen when it is taken, so after the if a slot is
                # as unsynchronised as the worse of the two paths (the last KV iteration skips the
                # prefetch, and with it the barrier inside that a later reader must not rely on).
                skipped = copy.deepcopy(self.st)
                self.run(node.body, env, loop_vars)
                self._merge_skipped(skipped)

    def op(self, op: Op, env: dict, loop_vars: tuple) -> None:
        key = id(op)
        forced_wait, forced_barrier = op.wait, op.barrier
        # RAW: wait for the groups that filled what this op reads (and slots it overwrites in flight).
        wait_n = forced_wait
        touched = []
        for buf in op.reads:
            if buf not in self.st.last_tile:
                raise TranslationError(f"{buf} is read before any Copy fills it", op.line)
            tile = self.st.last_tile[buf]
            touched.append(self._slot_of(buf, tile))
            self.read_points.setdefault((key, buf), []).append((tuple(env.get(v, 0) for v in loop_vars), tile))
        write_slots = []
        for w in op.writes:
            tile = expr_eval(w.tile, {**self.symbols, **env}, op.line) if w.tile else 0
            write_slots.append((w.buffer, tile, self._slot_of(w.buffer, tile)))
        for slot_key in touched + [ws[2] for ws in write_slots]:
            s = self.st.slot(slot_key)
            if s.group is not None:
                n = self.st.committed - s.group - 1
                if wait_n is None or n <= wait_n:
                    wait_n = n
                    self.reasons.setdefault(key, []).append(
                        f"wait for {slot_key[0]}[slot {slot_key[1]}] (cp.async of TL {s.writer}); "
                        f"{n} later group(s) may stay in flight")
        if wait_n is not None:
            self._wait(wait_n)
            if forced_wait is None or wait_n < forced_wait:
                # the body is emitted once: a requirement holds from now on, also in later iterations
                op.wait, self.changed = wait_n, True
        barrier = forced_barrier
        for slot_key in touched:
            if self.st.slot(slot_key).local:
                barrier = True
                self.reasons.setdefault(key, []).append(
                    f"{slot_key[0]}[slot {slot_key[1]}] was written by other threads: barrier before reading")
        for buf, _tile, slot_key in write_slots:
            if self.st.slot(slot_key).read_since_barrier:
                barrier = True
                self.reasons.setdefault(key, []).append(
                    f"{slot_key[0]}[slot {slot_key[1]}] is still read by other threads: barrier before overwriting")
        if barrier:
            self._barrier()
            if not forced_barrier:
                op.barrier, self.changed = True, True
        # The op itself.
        for slot_key in touched:
            self.st.slot(slot_key).read_since_barrier = True
        for buf, tile, slot_key in write_slots:
            s = self.st.slot(slot_key)
            self.st.last_tile[buf] = tile
            s.writer = op.line
            if op.async_copy:
                s.group, s.local = self.st.committed, False
            else:
                s.group, s.local = None, True
            if op.data.get("reads_back"):       # e.g. the epilogue stages O through shared memory
                s.read_since_barrier = True
        if op.async_copy:
            self.st.committed += 1


def schedule(nodes: list, stages: dict[str, int], symbols: dict[str, int]) -> None:
    """Fill ``wait``, ``barrier``, ``reasons`` and ``read_tiles`` of every op in ``nodes`` (in place)."""
    ops = list(iter_ops(nodes))
    for op in ops:
        op.wait, op.barrier, op.reasons, op.read_tiles = None, False, [], {}
    symbols = {**symbols, "N": SIM_LOOP_STOP}
    for _ in range(8):
        sim = _Sim(stages, symbols)
        sim.run(nodes, {}, ())
        for op in ops:
            for r in sim.reasons.get(id(op), []):
                if r not in op.reasons:
                    op.reasons.append(r)
        if not sim.changed:
            break
    for op in ops:   # keep the reasons that explain the final wait count
        op.reasons = [r for r in op.reasons if not r.startswith("wait for") or
                      (op.wait is not None and f"; {op.wait} later" in r)]
        for buf in op.reads:
            op.read_tiles[buf] = _fit_tile(sim.read_points.get((id(op), buf), []), op)


def _fit_tile(points: list[tuple[tuple, int]], op: Op) -> str:
    """The tile a read sees as an expression of the innermost loop variable: ``a*i + b``."""
    if not points:
        return "0"
    values = {p[1] for p in points}
    if len(values) == 1:
        return str(values.pop())
    var_count = len(points[0][0])
    if var_count == 0:
        raise TranslationError("the tile read here is not fixed", op.line)
    xs = [p[0][-1] for p in points]
    ys = [p[1] for p in points]
    a = (ys[1] - ys[0]) // max(1, xs[1] - xs[0]) if xs[1] != xs[0] else 0
    b = ys[0] - a * xs[0]
    if any(a * x + b != y for x, y in zip(xs, ys)):
        raise TranslationError(
            "the K/V tile this statement reads is not an affine function of the loop index "
            f"(tiles seen: {ys[:6]}); check the prefetch coordinates", op.line)
    return f"{a}*{{var}} + {b}" if a != 1 else (f"{{var}} + {b}" if b else "{var}")
