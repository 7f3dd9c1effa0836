"""How every public loss is declared, read from the classes and the source (static: under
TensorFlow only, not once per backend): a written ``__init__`` with keyword-only shared
arguments, each functional form with its class's arguments and defaults, and the guide's
example loss (docs/extending.md) written with public names only.
"""

from __future__ import annotations

import inspect
import pathlib
import re

import keras
import pytest

from tfdml import losses
from tfdml.losses._docstrings import SHARED

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def test_the_guide_example_uses_public_names_only():
    text = GUIDE.read_text()
    section = text[text.index("## Adding a loss"):text.index("## Checklist")]
    imports = re.findall(r"^(?:from|import) (\S+)", section, re.M)
    assert imports and all(not part.startswith("_") for name in imports
                           for part in name.split(".")), imports



#: A docstring line that is a placeholder of :func:`tfdml._docs.fill_doc` left unfilled.
PLACEHOLDER = re.compile(r"^\s*\{[A-Z_]+\}\s*$", re.M)


def _public(kind):
    return [(name, obj) for name, obj in ((n, getattr(losses, n)) for n in losses.__all__)
            if (inspect.isclass(obj) and issubclass(obj, keras.losses.Loss)) == (kind == "class")
            and (kind == "class" or inspect.isfunction(obj)) and name != "functional_form"]


@pytest.mark.parametrize("name,cls", _public("class"), ids=[n for n, _ in _public("class")])
def test_every_loss_class_has_a_written_init(name, cls):
    """What type checkers and ``help()`` read: a real ``__init__`` in the source, with named
    arguments (no generated ``__signature__``)."""
    init = cls.__init__
    assert "__signature__" not in vars(init), name
    assert init.__qualname__.split(".")[0] in {c.__name__ for c in cls.__mro__}
    assert re.match(r"def __init__\(\s*self", inspect.getsource(init).lstrip()), name
    kinds = {p.kind for p in inspect.signature(init).parameters.values()}
    assert inspect.Parameter.VAR_POSITIONAL not in kinds, name
    parameters = inspect.signature(init).parameters
    positional = [key for key in SHARED if key in parameters
                  and parameters[key].kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not positional, f"{name}: shared arguments to pass by keyword only: {positional}"
    assert not PLACEHOLDER.search(cls.__doc__ or ""), f"{name}: an unfilled placeholder"


def _class_of(fn):
    """The loss class whose default ``name`` is the function's name."""
    for name in losses.__all__:
        cls = getattr(losses, name)
        if (inspect.isclass(cls) and issubclass(cls, keras.losses.Loss)
                and inspect.signature(cls).parameters.get("name") is not None
                and inspect.signature(cls).parameters["name"].default == fn.__name__):
            return cls
    return None


@pytest.mark.parametrize("name,fn", _public("function"), ids=[n for n, _ in _public("function")])
def test_every_functional_form_has_its_class_arguments_and_defaults(name, fn):
    """A functional form built by ``functional_form`` has its class's own arguments and
    defaults by construction; a written one (class vectors passed in, two views) must give
    every argument it shares with its class the class's default."""
    assert fn.__doc__ and not PLACEHOLDER.search(fn.__doc__), name
    cls = getattr(fn, "loss_class", None) or _class_of(fn)
    if cls is None:
        # Functions with no class: a statistic, and a loss of query-key pairs.
        assert name in ("false_positive_probability", "multiple_negatives_ranking_loss"), name
        return
    own = inspect.signature(cls).parameters
    mine = inspect.signature(fn).parameters
    shared = [key for key in mine if key in own and key not in ("name", "reduction", "dtype")]
    for key in shared:
        assert mine[key].default == own[key].default, (name, key)
    if getattr(fn, "loss_class", None) is not None:
        inner = [key for key in own if key not in SHARED]
        assert [key for key in mine if key in own and key not in SHARED] == inner, name
