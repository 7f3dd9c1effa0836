"""tfdml._pyplot: matplotlib, imported when a plot is made, and what to install without it."""

from __future__ import annotations

import importlib

import pytest

from tfdml import _pyplot


def test_import_pyplot_and_figure_give_matplotlib():
    pytest.importorskip("matplotlib")
    import matplotlib.figure
    import matplotlib.pyplot

    assert _pyplot.import_pyplot() is matplotlib.pyplot
    assert _pyplot.import_figure() is matplotlib.figure.Figure


@pytest.mark.parametrize("function", [_pyplot.import_pyplot, _pyplot.import_figure])
def test_without_matplotlib_the_error_says_what_to_install(function, monkeypatch):
    real = importlib.import_module

    def missing(name, *args):
        if name.startswith("matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ImportError, match=r"pip install matplotlib.*\.\[plot\]") as info:
        function()
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
