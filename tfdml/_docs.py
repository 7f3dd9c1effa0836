"""Documentation written once: docstring fragments, and the reference tables read from the code.

* :func:`fill_doc`: docstring text written once and filled into the docstrings of several
  functions; :func:`nonfinite_raises`, one such text: the ``Raises`` entry of a function
  that refuses non-finite rows.
* :func:`public_packages`, :func:`public_names`, :func:`documentation`: the public names of
  tfdml and their documentation, which the documentation site renders and checks.
* :func:`loss_rows`, :func:`loss_table`, :func:`block_size_losses`: the table of losses and
  the list of the losses that run in row blocks, generated from ``tfdml.losses`` when the
  site is built.

Nothing here imports the rest of tfdml: the functions take the modules they read as
arguments.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import textwrap

import keras

__all__ = [
    "EXAMPLE_ARGUMENTS",
    "block_size_losses",
    "constant_doc",
    "documentation",
    "fill_doc",
    "loss_classes",
    "loss_rows",
    "loss_table",
    "missing_from_api",
    "nonfinite_raises",
    "public_names",
    "public_packages",
    "whole_batch_miners",
]


def fill_doc(**fragments):
    """Decorator: each docstring line that is only ``{NAME}`` becomes ``fragments[NAME]``.

    Every line of the fragment is indented as the placeholder was, so a fragment is
    written flush left (its own continuation lines indented relative to that); its own
    placeholder lines are filled in turn. A placeholder without a fragment raises a
    KeyError when the module is imported. A docstring stripped by ``python -OO`` stays
    ``None``.
    """

    def decorate(obj):
        if obj.__doc__:
            obj.__doc__ = _fill(obj.__doc__, fragments)
        return obj

    return decorate


def nonfinite_raises(*names):
    """The ``Raises`` entry of a metric that refuses non-finite rows of ``names``.

    Args:
        *names: the arguments whose rows are checked, e.g. ``"embeddings"``.

    Returns:
        The entry, wrapped to 70 columns with its continuation lines indented by
        four spaces (for :func:`tfdml._docs.fill_doc`).
    """
    rows = " or ".join(f"``{name}``" for name in names)
    return textwrap.fill(f"ValueError: bad arguments, or a row of {rows} that holds a NaN or an "
                         "Inf (the message names the argument and the rows).", width=70,
                         subsequent_indent="    ")


def _fill(doc, fragments):
    lines = []
    for line in doc.split("\n"):
        key = line.strip()
        if not (key.startswith("{") and key.endswith("}") and key[1:-1].isidentifier()):
            lines.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        text = _fill(fragments[key[1:-1]], fragments)
        lines.extend(indent + part if part else "" for part in text.strip("\n").split("\n"))
    return "\n".join(lines)


# -- the public names and their documentation ---------------------------------------------------


def _is_namespace_package(module):
    """A package whose ``__all__`` names only its subpackages (``tfdml.compat``)."""
    names = getattr(module, "__all__", ())
    return bool(names) and all(
        inspect.ismodule(getattr(module, name)) for name in names)


def public_packages(root):
    """The public packages under ``root``: its ``__all__`` modules, each with its own page.

    A package whose ``__all__`` names only subpackages (``tfdml.compat``) gives those
    subpackages instead.

    Args:
        root: the top-level package (``tfdml``).

    Returns:
        A list of modules, in the order of ``root.__all__``.
    """
    found = []
    for name in root.__all__:
        module = getattr(root, name)
        if not inspect.ismodule(module):
            continue
        if _is_namespace_package(module):
            found.extend(getattr(module, sub) for sub in module.__all__)
        else:
            found.append(module)
    return found


def public_names(module):
    """The dotted public names of ``module``: every name of its ``__all__``.

    A name that is itself a module (``tfdml.data.augment``) is followed by the names of
    its own ``__all__``.

    Args:
        module: a module with an ``__all__``.

    Returns:
        A list of ``(dotted name, object, the module that exports it)``.
    """
    found = []
    for name in module.__all__:
        obj = getattr(module, name)
        found.append((f"{module.__name__}.{name}", obj, module))
        if inspect.ismodule(obj) and hasattr(obj, "__all__"):
            found.extend(public_names(obj))
    return found


def documentation(module, name):
    """The documentation of the public name ``module.name``, or ``""`` when it has none.

    A module, class or function has its own docstring (a class does not inherit its
    base's); any other value (a constant) has the ``#:`` comment lines above its
    assignment or the string after it (:func:`constant_doc`).

    Args:
        module: the module that exports the name.
        name: the name.

    Returns:
        The text, stripped.
    """
    obj = getattr(module, name)
    if inspect.isclass(obj):
        return inspect.cleandoc(obj.__dict__.get("__doc__") or "")
    if inspect.ismodule(obj) or inspect.isroutine(obj):
        return inspect.cleandoc(obj.__doc__ or "")
    return constant_doc(module, name)


def _sources(module):
    """The Python files of ``module`` (a package: all of its files), with their module names."""
    path = pathlib.Path(module.__file__)
    if path.name != "__init__.py":
        return [(path, module.__name__)]
    found = []
    for file in sorted(path.parent.rglob("*.py")):
        parts = file.relative_to(path.parent).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found.append((file, ".".join((module.__name__, *parts))))
    return found


def constant_doc(module, name):
    """The documentation of the constant ``module.name``, read from the source of its module.

    The comment lines starting with ``#:`` right above the assignment, or else the string
    right after it. The assignment is looked for in the module that defines the value
    (for a package, the submodule whose attribute is the same object).

    Args:
        module: the module (or package) that exports the constant.
        name: its name.

    Returns:
        The text, or ``""`` when there is none.
    """
    value = getattr(module, name)
    for path, module_name in _sources(module):
        defining = (module if module_name == module.__name__
                    else importlib.import_module(module_name))
        if getattr(defining, name, None) is not value:
            continue
        text = _assignment_doc(path.read_text(), name)
        if text:
            return text
    return ""


def _assignment_doc(source, name):
    tree = ast.parse(source)
    lines = source.splitlines()
    for index, node in enumerate(tree.body):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        comments = []
        row = node.lineno - 2
        while row >= 0 and lines[row].lstrip().startswith("#:"):
            comments.insert(0, lines[row].lstrip()[2:].strip())
            row -= 1
        if comments:
            return " ".join(comments)
        after = tree.body[index + 1] if index + 1 < len(tree.body) else None
        if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            return inspect.cleandoc(after.value.value)
    return ""


def missing_from_api(root, pages):
    """The public names of ``root`` that the API pages leave out or that have no documentation.

    A name is on a page when a line of the page is ``::: <dotted name>``; a name of a
    public submodule (``tfdml.data.augment.resize``) is also there through the line of
    its module.

    Args:
        root: the top-level package (``tfdml``).
        pages: the text of the API pages, joined.

    Returns:
        ``(absent, undocumented)``: two sorted lists of dotted names.
    """
    listed = {line[4:].strip() for line in pages.splitlines() if line.startswith("::: ")}
    absent, undocumented = set(), set()
    for package in public_packages(root):
        for dotted, _, module in public_names(package):
            parent = dotted.rsplit(".", 1)[0]
            if dotted not in listed and not (parent != package.__name__ and parent in listed):
                absent.add(dotted)
            if not documentation(module, dotted.rsplit(".", 1)[1]):
                undocumented.add(dotted)
    return sorted(absent), sorted(undocumented)


# -- the table of losses --------------------------------------------------------------------------

#: The values given to a loss's arguments without a default, to build one for the table.
#: ``"loss"`` and ``"losses"`` (wrappers) get the wrapped module's ``TripletNCALoss()``.
EXAMPLE_ARGUMENTS = {"num_classes": 3, "l": 4, "margin": 0.5, "tn": 10.0}
_EMBEDDING_DIM = 4


def loss_classes(losses):
    """The concrete public loss classes of ``losses`` (``tfdml.losses``), by name.

    A loss is a public ``keras.losses.Loss`` subclass; the bases that losses are built on
    (those whose docstring starts with "Base class") are left out.

    Args:
        losses: the ``tfdml.losses`` module.

    Returns:
        A dict ``{name: class}``, in the order of ``losses.__all__``.
    """
    found = {}
    for name in losses.__all__:
        obj = getattr(losses, name)
        if (inspect.isclass(obj) and issubclass(obj, keras.losses.Loss)
                and not (obj.__doc__ or "").lstrip().startswith("Base class")):
            found[name] = obj
    return found


def _example(cls, losses, **arguments):
    """An instance of the loss class ``cls`` with its defaults (:data:`EXAMPLE_ARGUMENTS`)."""
    for parameter in inspect.signature(cls.__init__).parameters.values():
        if (parameter.name == "self" or parameter.default is not parameter.empty
                or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)):
            continue
        if parameter.name == "loss":
            arguments["loss"] = losses.TripletNCALoss()
        elif parameter.name == "losses":
            arguments["losses"] = [losses.TripletNCALoss()]
        elif parameter.name in EXAMPLE_ARGUMENTS:
            arguments[parameter.name] = EXAMPLE_ARGUMENTS[parameter.name]
        else:
            raise KeyError(
                f"{cls.__name__} needs the argument {parameter.name!r}: give it an example "
                "value in tfdml._docs.EXAMPLE_ARGUMENTS for the table of losses.")
    return cls(**arguments)


def _state(loss):
    """What the loss keeps between steps, from the variables of its built ``LossState``."""
    state = getattr(loss, "state", None)
    if state is None:
        return ""
    loss.build_state(_EMBEDDING_DIM)
    learned, buffers, seeds = [], [], False
    for variable in state.variables:
        short = variable.path.split("/")[-1]
        if "seed_generator" in variable.path:
            seeds = True
        elif variable.trainable:
            learned.append(short)
        else:
            buffers.append(short)
    parts = []
    if learned:
        parts.append("learned: " + ", ".join(f"`{n}`" for n in learned))
    if buffers:
        parts.append("buffers: " + ", ".join(f"`{n}`" for n in buffers))
    if seeds:
        parts.append("the random miner's seed")
    return "; ".join(parts)


def _reference(doc):
    """The first work of the ``Reference:`` section of a docstring, on one line."""
    lines = doc.splitlines()
    for index, line in enumerate(lines):
        if line.strip() in ("Reference:", "References:"):
            block = []
            for more in lines[index + 1:]:
                if more.strip() and not more.startswith((" ", "\t")):
                    break
                block.append(more.strip())
            text = " ".join(" ".join(block).split())
            return text.split("; ")[0].rstrip(".")
    return ""


def loss_rows(losses):
    """One row per public loss of ``losses`` (``tfdml.losses``), read from the code.

    Args:
        losses: the ``tfdml.losses`` module.

    Returns:
        A list of dicts with the keys ``name``, ``summary`` (the first line of the class
        docstring), ``paper`` (the first work of its ``Reference:`` section), ``average``
        (the default of its ``average`` argument, None for a wrapper that averages as its
        loss, "" without the argument), ``block_size`` (whether ``__init__`` takes it) and
        ``state`` (what it keeps between steps, "" for nothing).
    """
    rows = []
    for name, cls in loss_classes(losses).items():
        doc = inspect.cleandoc(cls.__doc__ or "")
        parameters = inspect.signature(cls.__init__).parameters
        average = parameters["average"].default if "average" in parameters else ""
        rows.append({
            "name": name,
            "summary": doc.split("\n\n")[0].replace("\n", " "),
            "paper": _reference(doc),
            "average": average,
            "block_size": "block_size" in parameters,
            "state": _state(_example(cls, losses)),
        })
    return rows


def loss_table(losses):
    """The Markdown table of the losses of ``losses`` (``tfdml.losses``): :func:`loss_rows`.

    Args:
        losses: the ``tfdml.losses`` module.

    Returns:
        The table, one row per loss, each name linked to its reference entry.
    """
    out = ["| loss | what it is | paper | default `average` | `block_size` | state |",
           "|---|---|---|---|---|---|"]
    for row in loss_rows(losses):
        if row["average"] is None:
            average = "as the wrapped loss"
        elif row["average"] == "":
            average = "—"
        else:
            average = f'`"{row["average"]}"`'
        out.append(
            f"| [`{row['name']}`][tfdml.losses.{row['name']}] | {row['summary']} "
            f"| {row['paper'] or '—'} | {average} | {'yes' if row['block_size'] else 'no'} "
            f"| {row['state'] or '—'} |")
    return "\n".join(out)


def block_size_losses(losses):
    """The public losses of ``losses`` (``tfdml.losses``) whose ``__init__`` takes ``block_size``.

    A loss that takes the argument but raises a ValueError for any value but None (its
    terms cannot be computed in blocks) is listed apart.

    Args:
        losses: the ``tfdml.losses`` module.

    Returns:
        ``(takes, refuses)``: two lists of names, in the order of ``losses.__all__``.
    """
    takes, refuses = [], []
    for name, cls in loss_classes(losses).items():
        if "block_size" not in inspect.signature(cls.__init__).parameters:
            continue
        try:
            _example(cls, losses, block_size=2)
        except ValueError:
            refuses.append(name)
        else:
            takes.append(name)
    return takes, refuses


def whole_batch_miners(miners):
    """The public miners of ``miners`` (``tfdml.miners``) that cannot select in row blocks.

    Args:
        miners: the ``tfdml.miners`` module.

    Returns:
        The names of the ``Miner`` subclasses whose ``blockwise`` is False.
    """
    return [name for name in miners.__all__
            if inspect.isclass(obj := getattr(miners, name)) and issubclass(obj, miners.Miner)
            and getattr(obj, "blockwise", True) is False]
