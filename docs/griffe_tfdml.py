"""A griffe extension for the API pages: tfdml is read by importing it (``force_inspection``).

Its loss classes and functional forms get their signatures and docstrings when the package
is imported, so the API pages render the imported objects. Two things inspection gets wrong
are fixed here:

* a method made at import time in another module than its class (the ``__init__`` that a
  loss class gets from its spec) looks like an alias to a path that does not exist: it is
  inspected in place;
* a constant would show the docstring of its type (``tuple``, ``int``): it gets the ``#:``
  comment above its assignment instead (:func:`tfdml._docs.constant_doc`), or nothing.

Two habits of the Keras docstring style are read as Google style expects them:

* an ``Example:`` / ``Examples:`` section whose ``>>>`` lines are flush left gets them
  indented under it;
* ``a, b: as in ...`` in ``Args:`` documents each of ``a`` and ``b``.
"""

from __future__ import annotations

import importlib
import inspect
import re

import griffe

from tfdml import _docs


def _exists(path):
    """Whether the dotted ``path`` names an object: its longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")
_EXAMPLES = ("Example:", "Examples:")
_ARGS = ("Args:", "Arguments:", "Call arguments:")
_NAME = r"\*{0,2}[A-Za-z_]\w*"
_SHARED = re.compile(rf"^(\s+)({_NAME}(?:, *{_NAME})+|, *{_NAME}(?:, *{_NAME})*):(.*)$")


def _google(text):
    """The docstring ``text`` with flush-left examples indented and shared arguments split."""
    out, section = [], None
    for line in text.split("\n"):
        if _SECTION.match(line):
            section = line
            out.append(line)
            continue
        if section in _EXAMPLES:
            if not line.strip() and out[-1] in _EXAMPLES:
                continue  # the blank line between the title and the examples
            out.append("    " + line if line.strip() else line)
            continue
        shared = _SHARED.match(line) if section in _ARGS else None
        if shared:
            indent, names, rest = shared.groups()
            out.extend(f"{indent}{name.strip()}:{rest}" for name in names.split(",")
                       if name.strip())
            continue
        out.append(line)
    return "\n".join(out)


class TfdmlExtension(griffe.Extension):
    """Inspects what would be a broken alias, and documents constants from their comments."""

    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = _google(obj.docstring.value)

    def on_alias_instance(self, *, node, alias, agent, **kwargs):
        if not isinstance(node, griffe.ObjectNode) or _exists(alias.target_path):
            return
        for child in node.children:
            if child.name == alias.name and inspect.isroutine(child.obj):
                agent.current.del_member(alias.name)
                agent.inspect(child)
                return

    def on_attribute_instance(self, *, node, attr, agent, **kwargs):
        if not isinstance(node, griffe.ObjectNode):
            return
        value = node.obj
        if attr.docstring is not None and attr.docstring.value != _type_doc(value):
            return
        attr.docstring = None
        parent = node.parent.obj if node.parent is not None else None
        if parent is not None and type(parent).__name__ == "module":
            text = _docs.constant_doc(parent, node.name)
            if text:
                attr.docstring = griffe.Docstring(text, parent=attr)


def _type_doc(value):
    doc = getattr(type(value), "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else None
