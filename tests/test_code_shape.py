"""The shape the package keeps: short functions and modules, public Keras only, one name per ops.

The same holds for the examples' shared training loop (``examples/experiments/``). Read from
the source files (nothing is imported): no function body over 60 lines (after
its docstring), no module over 700 lines, no ``keras.src`` import and no private Keras
attribute, and Keras' ops imported as ``ops`` while tfdml's are ``dml`` (their
``maximum``/``minimum`` differ in the gradient at ties).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

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


# Private attributes of Keras objects: `x._name` where x is not tfdml's own object. The
# attributes tfdml sets on its own classes are listed; anything else is flagged for a look.
_OWN_PRIVATE = {
    # NamedTuple's own API (underscored so as not to clash with field names).
    "_fields", "_replace", "_asdict",
    # The index file (tfdml/search/persist.py) writes and restores an Index's own fields.
    "_structure", "_vectors", "_size", "_parameters", "_labels", "_ids", "_max_abs",
}


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_public_keras_only(path):
    text = path.read_text()
    assert "keras.src" not in text and "keras/src" not in text
    tree = ast.parse(text)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and node.attr not in _OWN_PRIVATE):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue  # the class's own attributes
            if isinstance(owner, ast.Name) and (owner.id.startswith("_") or owner.id == "dml"):
                continue  # tfdml's own modules (`_metrics._check_ks`, `dml._x`)
            found.append(f"line {node.lineno}: .{node.attr}")
    assert not found, found


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_keras_ops_is_ops_and_tfdml_ops_is_dml(path):
    text = path.read_text()
    assert not re.search(r"from keras import ops as \w+", text)
    for match in re.finditer(r"from tfdml import ([^\n]+)", text):
        names = [n.strip() for n in match.group(1).split(",")]
        assert "ops" not in names, "import tfdml's ops as dml"
