"""TL expressions: shape dimensions, coordinates, loop bounds and if-conditions.

The AST keeps expressions as normalised source text (``normalize``): tokens joined without spaces,
except one space between two word-like tokens (``i<N and j<M``) and between two ``/`` (``//`` would
start a comment). ``normalize`` is idempotent, so printing and re-parsing gives an equal AST.
``parse_expr`` gives a tree for consumers that need the meaning (``evaluate``, ``free_symbols``).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Mapping, Union

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|==|!=|\*\*|&&|\|\||[-+*/%()<>!,]))"
)
_WORD_OPS = {"and": "and", "or": "or", "not": "not", "&&": "and", "||": "or", "!": "not"}


class ExprError(ValueError):
    """A malformed expression; ``col`` is the 0-based offset in the expression text."""

    def __init__(self, message: str, col: int = 0):
        super().__init__(message)
        self.col = col


@dataclass(frozen=True)
class Tok:
    kind: str  # "num", "name" or "op"
    text: str
    col: int  # 0-based offset in the text


def tokenize(text: str) -> list[Tok]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise ExprError(f"unexpected character {text[col]!r} in expression", col)
        kind = m.lastgroup
        tokens.append(Tok(kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return tokens


def _is_word(tok_text: str) -> bool:
    return tok_text[:1].isalnum() or tok_text[:1] == "_"


def join_tokens(texts) -> str:
    """Canonical spacing of a token sequence (see the module doc)."""
    out = ""
    for text in texts:
        if out and ((_is_word(out[-1]) and _is_word(text)) or (out[-1] == "/" and text[0] == "/")):
            out += " "
        out += text
    return out


def normalize(text: str) -> str:
    """Canonical spelling of an expression; raises ExprError when it has characters TL does not use."""
    return join_tokens(t.text for t in tokenize(text))


# ---- a small Pratt parser -------------------------------------------------------------------------
Node = Union[tuple]
_BINARY = {"or": 1, "and": 2, "<": 4, ">": 4, "<=": 4, ">=": 4, "==": 4, "!=": 4,
           "+": 5, "-": 5, "*": 6, "/": 6, "%": 6, "**": 8}


class _Parser:
    def __init__(self, tokens: list[Tok], text_len: int):
        self.toks, self.i, self.end = tokens, 0, text_len

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise ExprError("expression ends too early", self.end)
        self.i += 1
        return tok

    def op_of(self, tok):
        if tok is None:
            return None
        if tok.kind == "op" or tok.text in ("and", "or"):
            return _WORD_OPS.get(tok.text, tok.text)
        return None

    def expr(self, min_prec: int = 0) -> Node:
        left = self.unary()
        while True:
            op = self.op_of(self.peek())
            prec = _BINARY.get(op) if op else None
            if prec is None or prec <= min_prec:
                return left
            self.take()
            right = self.expr(prec if op != "**" else prec - 1)
            left = ("bin", op, left, right)

    def unary(self) -> Node:
        tok = self.take()
        op = _WORD_OPS.get(tok.text, tok.text) if tok.kind != "num" else None
        if op == "-" or op == "+":
            inner = self.expr(7)
            return ("neg", inner) if op == "-" else inner
        if op == "not":
            return ("not", self.expr(3))
        if tok.kind == "num":
            return ("num", float(tok.text) if "." in tok.text else int(tok.text))
        if tok.kind == "name" and tok.text not in ("and", "or"):
            nxt = self.peek()
            if nxt is not None and nxt.text == "(":
                self.take()
                args = []
                if self.peek() is not None and self.peek().text == ")":
                    self.take()
                    return ("call", tok.text, ())
                while True:
                    args.append(self.expr())
                    sep = self.take()
                    if sep.text == ")":
                        return ("call", tok.text, tuple(args))
                    if sep.text != ",":
                        raise ExprError(f"expected ',' or ')' in call, got {sep.text!r}", sep.col)
            return ("name", tok.text)
        if tok.text == "(":
            inner = self.expr()
            close = self.take()
            if close.text != ")":
                raise ExprError(f"expected ')', got {close.text!r}", close.col)
            return inner
        raise ExprError(f"unexpected {tok.text!r} in expression", tok.col)


@functools.lru_cache(maxsize=4096)
def parse_expr(text: str) -> Node:
    """Parse an expression into a tuple tree: ("num", v), ("name", s), ("bin", op, l, r),
    ("neg", e), ("not", e), ("call", fname, args). Raises ExprError. Cached: a search space evaluates the same
    few constraint texts for every point it enumerates, and the trees are immutable."""
    tokens = tokenize(text)
    if not tokens:
        raise ExprError("empty expression", 0)
    parser = _Parser(tokens, len(text))
    tree = parser.expr()
    extra = parser.peek()
    if extra is not None:
        raise ExprError(f"unexpected {extra.text!r} after the expression", extra.col)
    return tree


def free_symbols(text: str) -> set[str]:
    """Names an expression refers to (function names excluded)."""
    out: set[str] = set()

    def visit(node):
        if node[0] == "name":
            out.add(node[1])
        elif node[0] == "call":
            for arg in node[2]:
                visit(arg)
        else:
            for child in node[1:]:
                if isinstance(child, tuple):
                    visit(child)

    visit(parse_expr(text))
    return out


_FUNCS = {"min": min, "max": max, "ceil_div": lambda a, b: -(-a // b), "cdiv": lambda a, b: -(-a // b)}


def evaluate(text: str, env: Mapping[str, Union[int, float]]):
    """Value of an expression with the symbols of ``env``; ``/`` keeps integers when exact.
    Raises ExprError for an unknown symbol or function."""

    def ev(node):
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "name":
            if node[1] not in env:
                raise ExprError(f"unresolved symbol {node[1]!r}")
            return env[node[1]]
        if kind == "neg":
            return -ev(node[1])
        if kind == "not":
            return not ev(node[1])
        if kind == "call":
            if node[1] not in _FUNCS:
                raise ExprError(f"unknown function {node[1]!r}")
            return _FUNCS[node[1]](*(ev(a) for a in node[2]))
        op, a, b = node[1], ev(node[2]), ev(node[3])
        if op == "/":
            if b == 0:
                raise ExprError("division by zero")
            q = a / b
            return int(q) if isinstance(a, int) and isinstance(b, int) and a % b == 0 else q
        return {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "%": lambda: a % b,
            "**": lambda: a ** b, "<": lambda: a < b, ">": lambda: a > b, "<=": lambda: a <= b,
            ">=": lambda: a >= b, "==": lambda: a == b, "!=": lambda: a != b,
            "and": lambda: a and b, "or": lambda: a or b,
        }[op]()

    return ev(parse_expr(text))
