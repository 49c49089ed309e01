"""Attention problems, re-exported for the tuner: the definitions live below the compiler
(``translate/problem.py``), which must not import the tuner."""
from translate.problem import (DTYPES, GQA_GROUP, HEAD_DIMS, MLA_D_QK, MLA_D_V, VARIANTS, KernelSpec,  # noqa: F401
                               Problem, grid_problems, heads_for, spec_for, validate_problem, variant_of_heads)
