"""The package's layers, read from the source (nothing is imported).

Each module of ``tfdml`` belongs to a layer (``LAYERS``, bottom first). A module imports
modules of lower layers and of its own package only, never a higher layer, and nothing of
``examples/`` (the paper scripts' training loop builds on the package); inside a package
the imports form no cycle (imports inside functions count: a lazy import hides a
circle, it does not remove it); and no module imports another module's private
(``_name``) names: a name one module shares with another is public, in a private module
when it is plumbing.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfdml"
EXAMPLES = PACKAGE.parent / "examples"

#: Bottom first. A module's layer is that of the longest prefix of its name listed here.
LAYERS = (
    ("tfdml._version", "tfdml._argument_checks", "tfdml._files", "tfdml._docs", "tfdml._install",
     "tfdml._shims", "tfdml._tensorflow", "tfdml._embeddings", "tfdml._pyplot", "tfdml._labels",
     "tfdml._endless"),
    ("tfdml.ops", "tfdml.layers", "tfdml.geometry"),
    ("tfdml.miners",),
    ("tfdml.losses",),
    ("tfdml.models",),
    ("tfdml.search",),
    ("tfdml.metrics",),
    ("tfdml.data", "tfdml.datasets", "tfdml.callbacks", "tfdml.export", "tfdml.analysis"),
    ("tfdml.compat",),
    ("tfdml",),
)


def _modules():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _layer(name):
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (
                    best is None or len(prefix) > len(best[1])):
                best = (level, prefix)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best


def _imports(name):
    """``(target module, imported name or None, line)`` for each tfdml import of ``name``."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tfdml":
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] != "tfdml":
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if full in MODULES:
                    yield full, None, node.lineno
                else:
                    yield module, alias.name, node.lineno


def _edges():
    return {name: sorted({t for t, _, _ in _imports(name) if t in MODULES and t != name})
            for name in MODULES}


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_module_imports_a_higher_layer():
    upward = []
    for name in MODULES:
        level, _ = _layer(name)
        for target, _, line in _imports(name):
            if target in MODULES and _layer(target)[0] > level:
                upward.append(f"{name}:{line} imports {target}")
    assert not upward, upward


def test_the_package_imports_nothing_of_the_examples():
    # The top-level names under examples/: its scripts and packages (the training loop,
    # imported as `experiments`), as a script that puts examples/ on sys.path sees them.
    names = ({path.stem for path in EXAMPLES.glob("*.py")}
             | {path.parent.name for path in EXAMPLES.glob("*/__init__.py")})
    assert "experiments" in names
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            found += [f"{name}:{node.lineno} imports {t}" for t in targets
                      if t.split(".")[0] in names]
    assert not found, found


def test_no_import_cycles():
    edges = _edges()
    # A package's __init__ re-exports its modules: the edge from a module to its own
    # package's __init__ is what makes a cycle, and is reported as one.
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in edges[node]:
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in MODULES:
        if name not in state:
            visit(name)
    assert not cycles, cycles


def test_no_private_names_across_modules():
    private = []
    for name in MODULES:
        for target, imported, line in _imports(name):
            if imported and imported.startswith("_") and not imported.startswith("__"):
                private.append(f"{name}:{line} takes {target}.{imported}")
    assert not private, private


@pytest.mark.parametrize("name", ["tfdml.ops", "tfdml.losses.base", "tfdml.models.metric_model"])
def test_the_layer_table_reads_real_modules(name):
    assert name in MODULES and _edges()[name]
