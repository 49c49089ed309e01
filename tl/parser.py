"""The TL parser: text -> ``tl.ast.Program`` plus every syntax error found.

Two layers. A per-line statement parser (a hand-written tokenizer and recursive descent, so that
each error names the exact column) turns one line into one statement or a block header. A block
structurer then builds the tree with both loop styles of the spec: ``for ... end`` / ``if ... end``
(free indentation inside) and python-style ``for i in 0:K:`` whose body is the more-indented lines.
A bad line gives a ``syntax`` diagnostic and parsing goes on, so every error is reported at once.
``parse`` never raises, whatever the text holds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from tl.ast import LEVELS, ROLES, Allocate, Compute, Copy, For, If, Program, Reshape, TensorRef, Warpgroup
from tl.diagnostics import Diagnostic, TLSyntaxError
from tl.expr import ExprError, join_tokens, parse_expr

__all__ = ["ParseResult", "parse", "parse_program"]


@dataclass(frozen=True)
class ParseResult:
    """``program`` is None exactly when ``diagnostics`` is not empty. ``recovered`` is the program
    without its bad lines (blocks closed at the end), for reporting further errors line by line."""

    program: Optional[Program]
    diagnostics: tuple[Diagnostic, ...]
    recovered: Optional[Program] = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return not self.diagnostics


# ---- tokens of one line -------------------------------------------------------------------------
_TOKEN_RE = re.compile(
    r"(?P<num>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|==|!=|\*\*|&&|\|\||[-+*/%()\[\],.:=<>!])"
)
_SPACE = " \t\f\v"


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "name", "op"
    text: str
    col: int  # 1-based

    def kw(self, *words: str) -> bool:
        return self.kind == "name" and self.text.lower() in words


class _LineError(Exception):
    def __init__(self, col: int, message: str, hint: str = ""):
        super().__init__(message)
        self.col, self.message, self.hint = col, message, hint


def _strip_comment(text: str) -> str:
    """Drop a ``//`` (or ``#``) comment; TL has no string literals, so the first marker starts it."""
    cut = len(text)
    for marker in ("//", "#"):
        at = text.find(marker)
        if at != -1:
            cut = min(cut, at)
    return text[:cut]


def _tokenize(text: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(text):
        ch = text[pos]
        if ch in _SPACE:
            pos += 1
            continue
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise _LineError(pos + 1, f"unexpected character {ch!r}",
                             "TL lines use names, numbers, ( ) [ ] , . : = and arithmetic operators")
        tokens.append(Token(m.lastgroup, m.group(m.lastgroup), pos + 1))
        pos = m.end()
    return tokens


# ---- statement parser -----------------------------------------------------------------------------
@dataclass
class _Header:
    """A block opener (``for``/``if``) waiting for its body."""

    kind: str  # "for", "if" or "warpgroup"
    python: bool  # python style: body is the indented lines, no ``end``
    line: int
    col: int
    indent: int
    var: str = ""
    start: str = ""
    stop: str = ""
    condition: str = ""
    stages: Optional[str] = None
    role: str = ""
    body: list = field(default_factory=list)


class _End:
    def __init__(self, col: int):
        self.col = col


class _Cursor:
    def __init__(self, tokens: list[Token], line_len: int):
        self.toks, self.i, self.eol = tokens, 0, line_len + 1

    def peek(self, k: int = 0) -> Optional[Token]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at_end(self) -> bool:
        return self.i >= len(self.toks)

    def col(self) -> int:
        tok = self.peek()
        return tok.col if tok else self.eol

    def take(self, what: str) -> Token:
        tok = self.peek()
        if tok is None:
            raise _LineError(self.eol, f"expected {what}, but the line ends")
        self.i += 1
        return tok

    def expect_kw(self, *words: str, hint: str = "") -> Token:
        tok = self.peek()
        if tok is None or not tok.kw(*words):
            found = f"got {tok.text!r}" if tok else "the line ends"
            raise _LineError(self.col(), f"expected {' or '.join(repr(w) for w in words)}, {found}", hint)
        self.i += 1
        return tok

    def expect_op(self, op: str, hint: str = "") -> Token:
        tok = self.peek()
        if tok is None or tok.kind != "op" or tok.text != op:
            found = f"got {tok.text!r}" if tok else "the line ends"
            raise _LineError(self.col(), f"expected {op!r}, {found}", hint)
        self.i += 1
        return tok

    def name(self, what: str, hint: str = "") -> Token:
        tok = self.peek()
        if tok is None or tok.kind != "name":
            found = f"got {tok.text!r}" if tok else "the line ends"
            raise _LineError(self.col(), f"expected {what}, {found}", hint)
        self.i += 1
        return tok

    def done(self, hint: str = "") -> None:
        tok = self.peek()
        if tok is not None:
            raise _LineError(tok.col, f"unexpected {tok.text!r} at the end of the statement", hint)

    def rest(self) -> list[Token]:
        out = self.toks[self.i:]
        self.i = len(self.toks)
        return out


def _expr(tokens: list[Token], col: int, what: str) -> str:
    if not tokens:
        raise _LineError(col, f"missing {what}")
    text = join_tokens(t.text for t in tokens)
    try:
        parse_expr(text)
    except ExprError as exc:
        raise _LineError(tokens[0].col, f"bad {what} {text!r}: {exc}")
    return text


def _split_top(tokens: list[Token], sep: str) -> list[list[Token]]:
    """Split at ``sep`` outside parentheses."""
    parts, depth, cur = [], 0, []
    for tok in tokens:
        if tok.text in ("(", "["):
            depth += 1
        elif tok.text in (")", "]"):
            depth -= 1
        if tok.text == sep and tok.kind == "op" and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append(tok)
    parts.append(cur)
    return parts


def _bracketed(cur: _Cursor, open_: str, close: str, what: str) -> list[Token]:
    """Tokens between a balanced ``open_`` ... ``close`` (the cursor is on ``open_``)."""
    start = cur.expect_op(open_)
    depth, inner = 1, []
    while True:
        tok = cur.peek()
        if tok is None:
            raise _LineError(start.col, f"unclosed {open_!r} in {what}", f"close it with {close!r}")
        cur.i += 1
        if tok.text in ("(", "["):
            depth += 1
        elif tok.text in (")", "]"):
            depth -= 1
            if depth == 0:
                if tok.text != close:
                    raise _LineError(tok.col, f"{open_!r} closed by {tok.text!r} in {what}")
                return inner
        inner.append(tok)


def _shape(cur: _Cursor, what: str) -> tuple[str, ...]:
    open_col = cur.col()
    inner = _bracketed(cur, "(", ")", what)
    if not inner:
        raise _LineError(open_col, f"empty {what}", "write the dimensions, e.g. (BM, HeadDim)")
    return tuple(_expr(part, open_col, f"dimension of the {what}") for part in _split_top(inner, ","))


def _level(cur: _Cursor, stop_words: tuple[str, ...]) -> str:
    """A memory level: one of LEVELS (any case), or the words as written (``the moon``) for the
    checker to judge, so that a wrong level is a precise ``bad-copy`` rather than a syntax error."""
    words = []
    col = cur.col()
    while not cur.at_end() and cur.peek().kind == "name" and not cur.peek().kw(*stop_words):
        words.append(cur.take("a level").text)
    if not words:
        found = f"got {cur.peek().text!r}" if cur.peek() else "the line ends"
        raise _LineError(col, f"expected a memory level (global, shared, register), {found}")
    level = " ".join(words)
    return level.lower() if level.lower() in LEVELS else level


def _tensor_ref(cur: _Cursor) -> TensorRef:
    tok = cur.peek()
    if tok is not None and tok.kind == "num":
        cur.i += 1
        return TensorRef(tok.text, False, line=0, col=tok.col)
    name = cur.name("a tensor name")
    transposed = False
    if cur.peek() is not None and cur.peek().text == "." and cur.peek(1) is not None and cur.peek(1).kw("t"):
        cur.i += 2
        transposed = True
    return TensorRef(name.text, transposed, col=name.col)


def _parse_allocate(cur: _Cursor, line: int, col: int) -> Allocate:
    name = cur.name("the name of the tensor to allocate", "Allocate NAME in LEVEL (d0, d1)")
    cur.expect_kw("in", hint="Allocate NAME in LEVEL (d0, d1) [with offset EXPR]")
    level = _level(cur, ("with",))
    shape: tuple[str, ...] = ()
    if cur.peek() is not None and cur.peek().text == "(":
        shape = _shape(cur, "shape")
    offset = None
    if cur.peek() is not None and cur.peek().kw("with"):
        cur.take("with")
        cur.expect_kw("offset", hint="Allocate NAME in LEVEL (d0, d1) with offset EXPR")
        offset = _expr(cur.rest(), cur.eol, "offset")
    cur.done("Allocate NAME in LEVEL (d0, d1) [with offset EXPR]")
    return Allocate(name.text, level, shape, offset, line=line, col=col)


def _parse_copy(cur: _Cursor, line: int, col: int) -> Copy:
    hint = "Copy X [(d0, d1)] [in coordinate [L = i]] from LEVEL to LEVEL"
    tensor = _tensor_ref(cur)
    tensor = TensorRef(tensor.name, tensor.transposed, line=line, col=tensor.col)
    shape = coordinate = None
    if cur.peek() is not None and cur.peek().text == "(":
        shape = _shape(cur, "tile shape")
    if cur.peek() is not None and cur.peek().kw("in"):
        cur.take("in")
        cur.expect_kw("coordinate", "coordinates", hint=hint)
        open_col = cur.col()
        inner = _bracketed(cur, "[", "]", "coordinate")
        pairs = []
        for part in _split_top(inner, ","):
            eq = next((k for k, t in enumerate(part) if t.text == "="), None)
            if eq is None or eq == 0:
                raise _LineError(part[0].col if part else open_col, "a coordinate is AXIS = EXPR",
                                 "e.g. in coordinate [L = block_idx]")
            axis = _expr(part[:eq], open_col, "coordinate axis")
            pairs.append((axis, _expr(part[eq + 1:], part[eq].col, "coordinate")))
        coordinate = tuple(pairs)
    cur.expect_kw("from", hint=hint)
    src = _level(cur, ("to",))
    cur.expect_kw("to", hint=hint)
    dst = _level(cur, ())
    cur.done(hint)
    return Copy(tensor, src, dst, shape, coordinate, line=line, col=col)


def _parse_compute(cur: _Cursor, line: int, col: int) -> Compute:
    hint = "Compute OP a, b [and get [new] R | and accumulate R] [with X and Y]"
    op = cur.name("an operator name (GEMM, Softmax, Multiply, ...)", hint)
    args = []
    if not cur.at_end() and not cur.peek().kw("and", "with"):
        args.append(_with_line(_tensor_ref(cur), line))
        while cur.peek() is not None and cur.peek().text == ",":
            cur.take(",")
            args.append(_with_line(_tensor_ref(cur), line))
    result = mode = None
    with_: tuple[str, ...] = ()
    while not cur.at_end():
        tok = cur.peek()
        if tok.kw("and") and cur.peek(1) is not None and cur.peek(1).kw("get", "accumulate"):
            if result is not None:
                raise _LineError(tok.col, "a Compute has one result", hint)
            cur.take("and")
            verb = cur.take("get")
            if verb.kw("get"):
                mode = "get"
                if cur.peek() is not None and cur.peek().kw("new") and cur.peek(1) is not None:
                    cur.take("new")
                    mode = "get new"
            else:
                mode = "accumulate"
            result = cur.name("the result tensor", hint).text
        elif tok.kw("with"):
            if with_:
                raise _LineError(tok.col, "a Compute has one 'with' clause", hint)
            cur.take("with")
            names = [cur.name("a state tensor after 'with'", hint).text]
            while cur.peek() is not None and (cur.peek().text == "," or (
                    cur.peek().kw("and") and not (cur.peek(1) is not None and cur.peek(1).kw("get", "accumulate")))):
                cur.take("and")
                names.append(cur.name("a state tensor", hint).text)
            with_ = tuple(names)
        else:
            raise _LineError(tok.col, f"unexpected {tok.text!r} in a Compute statement", hint)
    return Compute(op.text, tuple(args), result, mode, with_, line=line, col=col)


def _with_line(ref: TensorRef, line: int) -> TensorRef:
    return TensorRef(ref.name, ref.transposed, line=line, col=ref.col)


def _parse_reshape(cur: _Cursor, line: int, col: int) -> Reshape:
    hint = "Reshape S from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N_new) [and get P]"
    name = cur.name("the tensor to reshape", hint)
    cur.expect_kw("from", hint=hint)
    src = _shape(cur, "source layout")
    cur.expect_kw("to", hint=hint)
    dst = _shape(cur, "target layout")
    result = None
    if cur.peek() is not None and cur.peek().kw("and"):
        cur.take("and")
        cur.expect_kw("get", hint=hint)
        result = cur.name("the name of the reshaped tensor", hint).text
    cur.done(hint)
    return Reshape(name.text, src, dst, result, line=line, col=col)


def _parse_for(cur: _Cursor, line: int, col: int, indent: int) -> _Header:
    hint = "for i = 0:N [with stages S] ... end, or python style: for i in 0:N: with an indented body"
    var = cur.name("the loop variable", hint)
    sep = cur.peek()
    if sep is None or not (sep.text == "=" or sep.kw("in")):
        raise _LineError(cur.col(), "expected '=' or 'in' after the loop variable", hint)
    cur.i += 1
    rest = cur.rest()
    python = bool(rest) and rest[-1].text == ":"
    if python:
        rest = rest[:-1]
    stages = None
    at = next((k for k, t in enumerate(rest) if t.kw("with")), None)
    if at is not None:
        clause = rest[at + 1:]
        if not clause or not clause[0].kw("stages"):
            raise _LineError(rest[at].col, "a loop's 'with' clause is 'with stages S'", hint)
        if len(clause) != 2 or clause[1].kind not in ("num", "name"):
            raise _LineError(clause[0].col, "'with stages' takes one number or symbol, e.g. 'with stages 2'", hint)
        stages = clause[1].text
        rest = rest[:at]
    if rest and rest[0].kw("range"):  # for i in range(a, b): is python, read it as a:b
        inner = _bracketed(_Cursor(rest[1:], cur.eol - 1), "(", ")", "range")
        parts = _split_top(inner, ",")
        if len(rest) != len(inner) + 3 or len(parts) not in (1, 2):
            raise _LineError(rest[0].col, "range(...) takes a stop or a start and a stop", hint)
        parts = [[Token("num", "0", rest[0].col)]] + parts if len(parts) == 1 else parts
    else:
        parts = _split_top(rest, ":")
        if len(parts) != 2:
            raise _LineError(rest[0].col if rest else cur.eol,
                             "a loop range is START:STOP" + (" (no step)" if len(parts) > 2 else ""), hint)
    start = _expr(parts[0], rest[0].col if rest else cur.eol, "loop start")
    stop = _expr(parts[1], rest[0].col if rest else cur.eol, "loop stop")
    return _Header("for", python, line, col, indent, var=var.text, start=start, stop=stop, stages=stages)


def _parse_warpgroup(cur: _Cursor, line: int, col: int, indent: int) -> _Header:
    hint = "warpgroup producer ... end  or  warpgroup consumer ... end"
    rest = cur.rest()
    python = bool(rest) and rest[-1].text == ":"
    if python:
        rest = rest[:-1]
    if len(rest) != 1 or rest[0].kind != "name":
        raise _LineError(rest[0].col if rest else cur.eol, "a warpgroup block names one role", hint)
    role = rest[0].text.lower() if rest[0].text.lower() in ROLES else rest[0].text
    return _Header("warpgroup", python, line, col, indent, role=role)


def _parse_if(cur: _Cursor, line: int, col: int, indent: int) -> _Header:
    rest = cur.rest()
    python = bool(rest) and rest[-1].text == ":"
    if python:
        rest = rest[:-1]
    if rest and rest[-1].kw("then"):
        rest = rest[:-1]
    condition = _expr(rest, cur.eol, "if condition")
    return _Header("if", python, line, col, indent, condition=condition)


_STATEMENTS = {"allocate": _parse_allocate, "copy": _parse_copy, "compute": _parse_compute,
               "reshape": _parse_reshape}


def _parse_line(tokens: list[Token], line: int, indent: int, line_len: int):
    cur = _Cursor(tokens, line_len)
    head = cur.take("a statement")
    col = head.col
    key = head.text.lower() if head.kind == "name" else ""
    if key in _STATEMENTS:
        return _STATEMENTS[key](cur, line, col)
    if key == "for":
        return _parse_for(cur, line, col, indent)
    if key == "if":
        return _parse_if(cur, line, col, indent)
    if key == "warpgroup":
        return _parse_warpgroup(cur, line, col, indent)
    if key in ("end", "endfor", "endif"):
        if key == "end" and cur.peek() is not None and cur.peek().kw("for", "if", "warpgroup"):
            cur.take("for")
        cur.done("'end' stands alone on its line")
        return _End(col)
    raise _LineError(col, f"unknown statement {head.text!r}",
                     "statements start with Allocate, Copy, Compute, Reshape, for, if, warpgroup or end")


# ---- block structure ------------------------------------------------------------------------------
def _indent_of(raw: str) -> int:
    width = 0
    for ch in raw:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += 4 - width % 4
        elif ch in "\f\v":
            continue
        else:
            break
    return width


def _close(header: _Header):
    body = tuple(header.body)
    style = "python" if header.python else "end"
    if header.kind == "for":
        return For(header.var, header.start, header.stop, body, style, header.stages,
                   line=header.line, col=header.col)
    if header.kind == "warpgroup":
        return Warpgroup(header.role, body, style, line=header.line, col=header.col)
    return If(header.condition, body, line=header.line, col=header.col)


def parse(text: str, path: str = "<string>") -> ParseResult:
    """Parse TL source; never raises. All syntax errors are in ``diagnostics``."""
    try:
        return _parse(text, path)
    except Exception as exc:  # a parser bug must not become a traceback for the user
        return ParseResult(None, (Diagnostic(path, 1, 1, "internal", f"parser failure: {exc!r}",
                                             "please report this input"),))


def _parse(text: str, path: str) -> ParseResult:
    if not isinstance(text, str):
        return ParseResult(None, (Diagnostic(path, 1, 1, "syntax", "TL source must be text", ""),))
    diags: list[Diagnostic] = []

    def error(line: int, col: int, message: str, hint: str = "") -> None:
        diags.append(Diagnostic(path, line, col, "syntax", message, hint))

    top: list = []
    stack: list[_Header] = []

    def body() -> list:
        return stack[-1].body if stack else top

    def close_top() -> None:
        header = stack.pop()
        if header.python and not header.body:
            error(header.line, header.col, f"python-style '{header.kind}' has no indented body",
                  f"indent its body deeper than line {header.line} (python style), or drop the trailing ':' and close the block with 'end'")
        body().append(_close(header))

    for lineno, raw in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        code = _strip_comment(raw)
        if code.strip(_SPACE + " ") == "":
            continue
        indent = _indent_of(code)
        try:
            tokens = _tokenize(code)
        except _LineError as exc:
            error(lineno, exc.col, exc.message, exc.hint)
            continue
        if not tokens:
            continue
        is_end = tokens[0].kw("end", "endfor", "endif")
        # A python-style block ends at the first line indented no deeper than its header.
        while stack and stack[-1].python and (indent < stack[-1].indent or (indent == stack[-1].indent and not is_end)):
            close_top()
        try:
            stmt = _parse_line(tokens, lineno, indent, len(code))
        except _LineError as exc:
            error(lineno, exc.col, exc.message, exc.hint)
            continue
        if isinstance(stmt, _End):
            if not stack:
                error(lineno, stmt.col, "'end' without an open 'for' or 'if'",
                      "remove it, or open the block it should close")
            else:
                close_top()
            continue
        if isinstance(stmt, _Header):
            stack.append(stmt)
            continue
        body().append(stmt)

    while stack:
        header = stack[-1]
        if header.python:
            close_top()
            continue
        error(header.line, header.col, f"'{header.kind}' at line {header.line} has no matching 'end'",
              f"add 'end' after the last statement of the {header.kind} body")
        close_top()

    if diags:
        diags.sort(key=lambda d: (d.line, d.col))
        return ParseResult(None, tuple(diags), Program(tuple(top)))
    return ParseResult(Program(tuple(top)), (), Program(tuple(top)))


def parse_program(text: str, path: str = "<string>") -> Program:
    """Parse TL source; raises ``TLSyntaxError`` (carrying the diagnostics) on any syntax error."""
    result = parse(text, path)
    if result.program is None:
        raise TLSyntaxError(result.diagnostics)
    return result.program
