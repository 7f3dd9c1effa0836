"""The shape the package keeps that ruff cannot check: short functions and modules.

Read from the source files (nothing is imported), the package's and the examples' shared
training loop's (``examples/experiments/``): no function body over 60 lines (after its
docstring), no module over 700 lines. The other rules are ruff's (pyproject.toml,
``make lint``): Keras' public API only (TID251), no private attribute of another object
(SLF001), and Keras' ops imported as ``ops`` while tfdml's are ``dml`` (ICN001).
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfdml"
#: The training loop the paper scripts share, outside the package.
PIPELINE = PACKAGE.parent / "examples" / "experiments"
SOURCES = sorted(PACKAGE.rglob("*.py")) + sorted(PIPELINE.rglob("*.py"))
MAX_BODY = 60
MAX_MODULE = 700


def _body_lines(node) -> int:
    body = node.body
    first = body[0]
    has_doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
    if has_doc:
        if len(body) == 1:
            return 0
        first = body[1]
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    return node.end_lineno - start + 1


def _relative(path):
    return str(path.relative_to(PACKAGE.parent))


def test_the_package_is_there():
    assert len(SOURCES) > 40
    assert PIPELINE / "train.py" in SOURCES


def test_no_function_body_over_60_lines():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _body_lines(node)
                if lines > MAX_BODY:
                    long.append(f"{_relative(path)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_module_over_700_lines():
    long = [f"{_relative(p)} ({n})" for p in SOURCES
            if (n := len(p.read_text().splitlines())) > MAX_MODULE]
    assert not long, long
