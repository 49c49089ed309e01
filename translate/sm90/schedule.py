"""Async dependency pass of the consumer warpgroups: where ``warpgroup_wait<N>`` goes, which pipeline
stages are handed back to the producer after it, and where the output's deferred rescale happens.

A wgmma GEMM is issued asynchronously and committed as one batch. The program order is the schedule;
this pass only adds what the order needs. It runs the lowered consumer symbolically (loops for a few
iterations) and tracks, per register tensor, the batch that writes it and the batch that reads it (the
P operand of an RS GEMM) while in flight:

* an ordinary op (mask, softmax, reshape, rescale, normalize, store) that touches a tensor an in-flight
  batch writes, or writes a tensor an in-flight batch reads, first waits until that batch is done:
  ``warpgroup_wait<n>`` with n = the batches committed after it (they may stay in flight);
* GEMMs chain without waiting (wgmma batches of a warpgroup complete in order);
* a GEMM that read a pipeline stage (K, V) hands the stage back (the empty barrier) at the first wait
  that completes it — guarded by a flag at run time, and only where every simulated visit agrees that
  the batch is complete there;
* ``Compute Softmax`` leaves a rescale factor for the output accumulator; it is applied at the first op
  after which no P·V GEMM in flight writes the accumulator (at the latest right before the next op that
  touches it), so the softmax of one tile runs while the previous tile's P·V GEMM is still on the
  tensor cores.

Requirements found in any iteration hold for all (a loop body is emitted once); the simulation is
repeated with them until nothing changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tl.expr import ExprError, evaluate
from translate.kernel import TranslationError
from translate.sm90.ir import Cond, Loop, Op, iter_ops

SIM_ITERATIONS = 4
SIM_TILE_COUNT = 1000       # N during the simulation: loops run their first iterations only


@dataclass
class _State:
    committed: int = 0
    done_below: int = 0
    writer: dict = field(default_factory=dict)      # tensor -> batch writing it
    reader: dict = field(default_factory=dict)      # tensor -> latest batch reading it
    pending: dict = field(default_factory=dict)     # GEMM op -> batch whose stages are not handed back
    rescale_pending: bool = False
    acc_zero: bool = False       # the output accumulator was cleared and no P·V GEMM wrote it since


class _Sim:
    def __init__(self, pv_acc: str, pipelined: set[str], forbidden: set, tensors: set[str]):
        self.pv_acc, self.pipelined, self.forbidden, self.tensors = pv_acc, pipelined, forbidden, tensors
        # Register fences around each wait (warpgroup_fence_operand): before it, the tensors no GEMM in
        # flight touches (so the compiler keeps the work on them above the wait); after it, those no GEMM
        # touches any more (so their uses stay below). Never a tensor a GEMM in flight writes or reads:
        # ptxas would serialise the wgmma. Intersected over every simulated visit.
        self.fence_before: dict = {}
        self.fence_after: dict = {}
        self.st = _State()
        self.changed = False
        self.released: set = set()        # (op, gemm) pairs released at op in some visit
        self.unsafe: set = set()          # (op, gemm): the gemm was pending but not complete at op
        self.q_reading: list = []         # batches of GEMMs that read Q
        self.q_clear: set = set()         # ops at which (after their wait) no Q-reading batch is in flight
        self.q_busy: set = set()

    def in_flight(self, batch) -> bool:
        return batch is not None and batch >= self.st.done_below

    def require(self, op: Op, batch: int, why: str) -> None:
        n = self.st.committed - batch - 1
        if op.wait is None or n < op.wait:
            op.wait, self.changed = n, True
        msg = f"{why}; {n} later batch(es) may stay in flight"
        if msg not in op.reasons:
            op.reasons.append(msg)

    def apply_wait(self, op: Op) -> None:
        if op.wait is None:
            return
        self.st.done_below = max(self.st.done_below, self.st.committed - op.wait)
        for gemm, batch in list(self.st.pending.items()):
            key = (id(op), id(gemm))
            if batch < self.st.done_below:
                if key not in self.forbidden:
                    self.released.add(key)
                    del self.st.pending[gemm]
            else:
                self.unsafe.add(key)

    def _busy(self) -> set:
        st = self.st
        return {t for t in self.tensors if self.in_flight(st.writer.get(t)) or self.in_flight(st.reader.get(t))}

    def _fences(self, op: Op, table: dict) -> None:
        free = self.tensors - self._busy()
        table[id(op)] = table[id(op)] & free if id(op) in table else free

    def run(self, nodes, env: dict) -> None:
        for node in nodes:
            if isinstance(node, Op):
                self.op(node)
            elif isinstance(node, Loop):
                try:
                    start = int(evaluate(node.start, {**env, "N": SIM_TILE_COUNT}))
                except (ExprError, TypeError, ValueError):
                    raise TranslationError(f"cannot evaluate the loop start {node.start!r}", node.stmt.line) from None
                for it in range(SIM_ITERATIONS):
                    self.run(node.body, {**env, node.var: start + it})
            elif isinstance(node, Cond):
                if any(o.kind == "gemm" for o in iter_ops(node.body)):
                    raise TranslationError("a consumer GEMM inside an `if` is not supported (the wait counts would "
                                           "differ between the paths)", node.stmt.line)
                self.run(node.body, env)

    def op(self, op: Op) -> None:
        st = self.st
        touched = set(op.reads) | set(op.writes)
        if st.rescale_pending and st.acc_zero:
            st.rescale_pending = False   # rescaling zeros changes nothing (the first tile's softmax)
        if st.rescale_pending and (self.pv_acc in touched or op.kind == "softmax"):
            if self.pv_acc not in op.rescale:
                op.rescale, self.changed = op.rescale + (self.pv_acc,), True
        rescale_now = self.pv_acc in op.rescale
        if op.kind == "gemm":
            prev = st.pending.get(op)
            if prev is not None and self.in_flight(prev):
                self.require(op, prev, "this GEMM's previous batch still holds its pipeline stage")
            deps = set(op.reads) - set(op.writes)     # the A operand; the accumulator chains
        else:
            deps = touched
        if rescale_now:
            deps = deps | {self.pv_acc}
        for t in sorted(deps):
            w = st.writer.get(t)
            if self.in_flight(w):
                self.require(op, w, f"{t} is written by a GEMM in flight")
        if op.kind != "gemm":
            for t in sorted(op.writes):
                r = st.reader.get(t)
                if self.in_flight(r):
                    self.require(op, r, f"{t} is read by a GEMM in flight")
        if op.kind in ("store_o", "drain") and st.committed > st.done_below:
            self.require(op, st.committed - 1, "the epilogue reuses shared memory that GEMMs read"
                         if op.kind == "store_o" else "every GEMM finishes before the consumer ends")
        if op.wait is not None:
            self._fences(op, self.fence_before)
            self.apply_wait(op)
            self._fences(op, self.fence_after)
        # Eager: once the P·V batch in flight has finished (after this op's wait), the factor is applied
        # here, off the path between the next GEMM issues (FA3's order for head dims <= 128).
        if st.rescale_pending and not rescale_now and not self.in_flight(st.writer.get(self.pv_acc)) \
                and op.kind not in ("gemm", "softmax"):
            op.rescale, self.changed, rescale_now = op.rescale + (self.pv_acc,), True, True
        if rescale_now:
            st.rescale_pending = False
        busy = any(self.in_flight(b) for b in self.q_reading)
        (self.q_busy if busy else self.q_clear).add(id(op))
        self.q_clear -= self.q_busy
        if op.kind == "softmax":
            st.rescale_pending = True
        if op.kind == "alloc_acc" and self.pv_acc in op.writes and op.data.get("clear"):
            st.acc_zero = True
        if op.kind == "gemm" and self.pv_acc in op.writes:
            st.acc_zero = False
        if op.kind == "gemm":
            batch = st.committed
            st.committed += 1
            for t in op.writes:
                st.writer[t] = batch
            for t in op.reads:
                if t not in op.writes:
                    st.reader[t] = batch
            if any(b in self.pipelined for b in op.data.get("buffers", ())):
                st.pending[op] = batch
            if op.data.get("mma") == "qk":
                self.q_reading.append(batch)


def _mark_q_release(nodes: list, q_buffers: set, sim_writer_done) -> None:
    """The op that hands Q back early: the first top-level op after the last node holding a GEMM that
    reads Q, at which no such GEMM is still in flight (the sim's verdict, ``sim_writer_done``)."""
    def reads_q(node) -> bool:
        return any(o.kind == "gemm" and set(o.data.get("buffers", ())) & q_buffers for o in iter_ops([node]))

    last = max((k for k, n in enumerate(nodes) if reads_q(n)), default=None)
    if last is None:
        return
    for node in nodes[last + 1:]:
        if isinstance(node, Op) and node.kind not in ("drain",) and sim_writer_done(node):
            node.data["release_q"] = True
            for later in nodes:
                if isinstance(later, Op) and later.kind == "store_o":
                    later.data["q_released"] = True
            return


def schedule_consumer(nodes: list, pv_acc: str, pipelined: set[str], q_buffers: set = frozenset(),
                      early_q_release: bool = False, tensors: set = frozenset()) -> dict:
    """Fill ``wait``, ``rescale``, ``releases`` of the consumer's ops in place; returns the GEMM ops that
    hold a stage until released (they get a flag and a slot variable in the emitted code). With
    ``early_q_release`` the op after which Q is no longer read is marked ``release_q``."""
    ops = list(iter_ops(nodes))
    for op in ops:
        op.wait, op.rescale, op.releases, op.reasons = None, (), (), []
        op.data.pop("release_q", None)
        op.data.pop("q_released", None)
    forbidden: set = set()
    for _ in range(16):
        sim = _Sim(pv_acc, pipelined, forbidden, set(tensors) | {pv_acc})
        sim.run(nodes, {})
        newly_forbidden = sim.released & sim.unsafe
        if not sim.changed and not newly_forbidden:
            break
        forbidden |= newly_forbidden
    else:
        raise TranslationError("the consumer's synchronisation did not settle (a bug: please report the sketch)")
    by_id = {id(o): o for o in ops}
    for op in ops:
        op.releases = tuple(by_id[g] for (o, g) in sorted(sim.released, key=lambda k: by_id[k[1]].line)
                            if o == id(op))
    for op in ops:
        if op.wait is not None:
            op.data["fence_before"] = tuple(sorted(sim.fence_before.get(id(op), ())))
            op.data["fence_after"] = tuple(sorted(sim.fence_after.get(id(op), ())))
    if early_q_release:
        _mark_q_release(nodes, q_buffers, lambda op: id(op) in sim.q_clear)
    return {op: True for op in ops if op.kind == "gemm" and any(b in pipelined for b in op.data.get("buffers", ()))}
