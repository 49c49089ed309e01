"""What the campaign needs of a benchmark problem, dense (kernel_abi.spec.Problem: one seqlen of the paper grid),
serving (tuner.measure.mixes.ServingProblem: a packed length mix of a serving layout) or decode
(tuner.measure.decode_problem.DecodeProblem: one decode call per decode bucket): its key in the trials' TFLOPS and the
baselines, its bucket, its order in tables, and the one the early stop probes."""
from __future__ import annotations


def is_decode(problem) -> bool:
    return getattr(problem, "phase", "prefill") == "decode"


def is_dense(problem) -> bool:
    return not hasattr(problem, "layout")


def problem_key(problem) -> str:
    """A dense problem's seqlen ("4096"), a serving mix's name ("8x2k")."""
    return str(problem.seqlen_k) if is_dense(problem) else problem.key


def bucket_of(problem) -> str:
    """The store bucket: tuner.serving.buckets.seqlen by seqlen for dense, tuner.measure.mixes' serving rule otherwise."""
    if is_dense(problem):
        from tuner.serving.buckets.seqlen import bucket_for

        return bucket_for(problem.seqlen_k)
    return problem.bucket


def problem_order(problem):
    """Tables and decisions list dense problems by seqlen, serving mixes by their bucket then work, decode calls
    by batch then KV length."""
    if is_decode(problem):
        return (problem.batch, problem.kv_len)
    return (problem.seqlen_k,) if is_dense(problem) else (problem.bucket, problem.flops)


def probe_problem(problems):
    """The problem the early stop probes first: the longest seqlen (dense), the mix of most work (serving):
    where one launch costs most and the winners separate (earlystop.py)."""
    if all(is_dense(p) for p in problems):
        return max(problems, key=lambda p: p.seqlen_k)
    return max(problems, key=lambda p: p.flops)


def probe_matches(problem, plan_key) -> bool:
    """Whether ``problem`` is the one an early-stop plan names (its ``seqlen``: an int for dense plans)."""
    return problem_key(problem) == str(plan_key)


def record_key(problem_dict: dict) -> str:
    """The key of a stored record's problem (its ``problem`` field: a dense problem's or a mix's fields)."""
    if "name" in problem_dict and ("layout" in problem_dict or problem_dict.get("phase") == "decode"):
        return str(problem_dict["name"])
    return str(problem_dict.get("seqlen_k"))
