"""Docstring text written once and filled into the docstrings of several functions."""

from __future__ import annotations

__all__ = ["fill_doc"]


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
