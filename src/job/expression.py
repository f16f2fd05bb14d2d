"""A config expression: a kernel's derived values, constraints and launch geometry
(conf/kernel/*.yaml), a tuned file's `when`. Arithmetic, comparisons, `and`/`or`/`not`, `x if c
else y` over names and numbers, and three functions (ceil_div, min, max); nothing else parses.

Each expression is checked against that whitelist once, its `*`, `**` and `<<` routed through
guards that keep integers below 2**MAX_BITS, and compiled to Python bytecode once per process. A
tune's plan checks every candidate at every training shape (160,000 specs, 5.6 million
expressions on an H100 re-tune): walking the tree in Python for each (simpleeval, before) took 50
of the plan's 60 s.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Any


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


FUNCTIONS = {"ceil_div": ceil_div, "min": min, "max": max}

# Integers in an expression stay below 2**MAX_BITS: an expression is a handful of operations on
# tile sizes and problem dimensions, so each costs microseconds, whatever the config says
# (4000000**4000000 alone took 43 s of CPU per evaluation).
MAX_BITS = 256


class ExpressionTooLarge(ArithmeticError):
    pass


class ExpressionNotAllowed(ValueError):
    """Syntax outside the whitelist: attributes, subscripts, lambdas, other calls, ..."""


def _bounded(result_bits: int, what: str) -> None:
    if result_bits > MAX_BITS:
        raise ExpressionTooLarge(f"{what} would exceed {MAX_BITS} bits")


def _power(a, b):
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
        _bounded(b * (abs(a).bit_length() - 1), f"{a} ** {b}")
    return a ** b


def _times(a, b):
    if isinstance(a, int) and isinstance(b, int):
        _bounded(abs(a).bit_length() + abs(b).bit_length() - 1, f"{a} * {b}")
        return a * b
    if isinstance(a, str) or isinstance(b, str):
        raise TypeError("strings cannot be multiplied in a kernel config expression")
    return a * b


def _shift(a, b):
    if isinstance(b, int) and b > 0:
        _bounded(abs(a).bit_length() + b, f"{a} << {b}")
    return a << b


# the guards are named with a leading underscore, which no name of an expression may have
GUARDS = {ast.Mult: ("_times", _times), ast.Pow: ("_power", _power), ast.LShift: ("_shift", _shift)}
GLOBALS = {"__builtins__": {}, **FUNCTIONS, **dict(GUARDS.values())}
ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
           ast.Name, ast.Load, ast.Constant, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)
CONSTANTS = (bool, int, float, str)


@lru_cache(maxsize=4096)
def parsed(expr: str) -> ast.expr:
    """The expression's syntax tree (SyntaxError if it does not parse)."""
    return ast.parse(expr.strip(), mode="eval").body


@lru_cache(maxsize=4096)
def names_in(expr: str) -> tuple[str, ...]:
    """The names the expression reads, in order of first use, the functions left out."""
    seen: list[str] = []
    for node in ast.walk(parsed(expr)):
        if isinstance(node, ast.Name) and node.id not in FUNCTIONS and node.id not in seen:
            seen.append(node.id)
    return tuple(seen)


class _Guard(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        guard = GUARDS.get(type(node.op))
        if guard is None:
            return node
        call = ast.Call(func=ast.Name(id=guard[0], ctx=ast.Load()), args=[node.left, node.right],
                        keywords=[])
        return ast.copy_location(call, node)


def _refusal(node: ast.AST) -> str | None:
    if not isinstance(node, ALLOWED):
        return f"{type(node).__name__} is not allowed"
    if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.keywords
                                       or node.func.id not in FUNCTIONS):
        return f"only {', '.join(FUNCTIONS)} may be called, with positional arguments"
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        return f"the name {node.id} starts with an underscore"
    if isinstance(node, ast.Constant) and not isinstance(node.value, CONSTANTS):
        return f"the constant {node.value!r} is not a number or a string"
    return None


@lru_cache(maxsize=4096)
def compiled(expr: str):
    """The expression's bytecode, its tree checked against the whitelist and its `*`, `**` and
    `<<` guarded (SyntaxError, ExpressionNotAllowed)."""
    tree = ast.parse(expr.strip(), mode="eval")  # its own copy: the guard rewrites it
    for node in ast.walk(tree):
        refusal = _refusal(node)
        if refusal:
            raise ExpressionNotAllowed(f"{refusal} in a config expression")
    return compile(ast.fix_missing_locations(_Guard().visit(tree)), "<config expression>", "eval")


def evaluate(expr: str, names: dict[str, Any]) -> Any:
    """The expression's value over `names` (NameError for a name not among them; the guards'
    ExpressionTooLarge, ZeroDivisionError, TypeError as Python raises them)."""
    return eval(compiled(expr), GLOBALS, names)  # noqa: S307 - a whitelisted tree, no builtins
