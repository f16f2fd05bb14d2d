"""Config expressions (src/job/expression.py): every expression the configs hold evaluates as
Python would, through the guarded bytecode; anything beyond arithmetic, comparisons and the
three functions is refused before it runs; the guards bound `*`, `**` and `<<`."""

from __future__ import annotations

import ast
import random

import pytest
import yaml

from src.job import expression
from src.job.expression import ExpressionNotAllowed, ExpressionTooLarge, evaluate
from tests.conftest import CONF_DIR

EXPRESSION_KEYS = ("derived", "constraints", "size_constraints", "launch", "measured_where")


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def config_expressions() -> list[str]:
    """Every string under the kernel configs' expression keys and the tuned files' `when`s
    that parses as a Python expression (entries and prose do not)."""
    found: set[str] = set()
    texts = []
    for path in sorted((CONF_DIR / "kernel").glob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        texts += [s for key in EXPRESSION_KEYS for s in _strings(config.get(key))]
    for path in sorted((CONF_DIR / "tuned").glob("*.yaml")):
        texts += [rule["when"] for rules in (yaml.safe_load(path.read_text()).get("dispatch") or {}).values()
                  for rule in rules if "when" in rule]
    for text in texts:
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            continue
        if not isinstance(tree.body, ast.Set):  # a pre-pass's entry, "{prepass_fn}", is a format
            found.add(text)
    return sorted(found)


def test_the_configs_hold_expressions_of_every_kind_the_whitelist_allows():
    kinds = {type(node).__name__ for text in config_expressions()
             for node in ast.walk(ast.parse(text.strip(), mode="eval"))}
    assert {"BinOp", "Compare", "BoolOp", "IfExp", "Call", "Mult", "FloorDiv", "Mod"} <= kinds
    assert len(config_expressions()) > 300


def test_every_config_expression_evaluates_as_python_would():
    """At random values of its names (the configs are trusted here: plain eval is the
    reference), the guarded bytecode gives Python's value, or the same exception type."""
    rng = random.Random(11)
    compared = 0
    for text in config_expressions():
        for _ in range(3):
            names = {name: rng.choice([1, 2, 3, 8, 64, 100, 128, 4096, 16385])
                     for name in expression.names_in(text)}
            try:
                want = eval(text.strip(), {"__builtins__": {}, **expression.FUNCTIONS}, dict(names))
            except Exception as exc:  # a division by zero at these values, say
                with pytest.raises(type(exc)):
                    evaluate(text, names)
                continue
            assert evaluate(text, names) == want, text
            compared += 1
    assert compared > 900


@pytest.mark.parametrize("text,said", [
    ("m.bit_length", "Attribute"),
    ("m.bit_length() > 0", "may be called"),
    ("(m, n)[0] > 0", "Subscript"),
    ("m in [1, 2]", "List"),
    ("m in (1, 2)", "Tuple"),
    ("(lambda: 1)() > 0", "may be called"),
    ("lambda: 1", "Lambda"),
    ("__import__('os').getcwd()", "may be called"),
    ("ceil_div(a=m, b=n)", "may be called"),
    ("open('/etc/passwd')", "may be called"),
    ("_times(m, n)", "may be called"),
    ("_times > 0", "underscore"),
    ("__builtins__", "underscore"),
    ("m if b'x' else n", "not a number or a string"),
    ("[x for x in (1, 2)]", "ListComp"),
    ("(m := 3)", "NamedExpr"),
])
def test_syntax_beyond_the_whitelist_is_refused_before_it_runs(text, said):
    with pytest.raises(ExpressionNotAllowed, match=said):
        evaluate(text, {"m": 2, "n": 3})


@pytest.mark.parametrize("text", ["4000000 ** 4000000", "m ** m ** m", "m << 4000000",
                                  " * ".join(["m"] * 30), "2 ** 300 + 1"])
def test_the_guards_refuse_integers_beyond_the_bound(text):
    with pytest.raises(ExpressionTooLarge):
        evaluate(text, {"m": 4096})


def test_ordinary_arithmetic_and_the_functions():
    names = {"m": 1000, "n": 17, "bm": 128}
    assert evaluate("ceil_div(m, bm) * bm", names) == 1024
    assert evaluate("max(n, 8) if m % 8 == 0 else min(n, 8)", names) == 17
    assert evaluate("2 ** 31 - 1 > m and not n == 16", names) is True
    assert evaluate("'a' if n % 4 else 'workspace'", names) == "a"
    with pytest.raises(TypeError, match="strings cannot be multiplied"):
        evaluate("'x' * 1000", names)
    with pytest.raises(NameError):
        evaluate("k > 0", names)
