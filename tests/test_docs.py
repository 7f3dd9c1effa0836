"""tfdml._docs.fill_doc: docstring text written once, filled into several docstrings."""

import pytest

from tfdml._docs import fill_doc

_ARGS = """\
x: the input.
    Continued.
{MORE}"""


def test_fragment_lines_take_the_indentation_of_the_placeholder():
    @fill_doc(ARGS=_ARGS, MORE="y: another input.")
    def f():
        """Summary.

        Args:
            {ARGS}

        Examples: {ARGS} stays as it is inside a line.
        """

    assert f.__doc__ == (
        "Summary.\n\n        Args:\n            x: the input.\n                Continued.\n"
        "            y: another input.\n\n        Examples: {ARGS} stays as it is inside a "
        "line.\n        "
    )


def test_unknown_placeholder_raises_and_missing_docstring_is_kept():
    with pytest.raises(KeyError, match="NOPE"):
        @fill_doc(ARGS=_ARGS)
        def f():
            """{NOPE}"""

    @fill_doc(ARGS=_ARGS)
    def g():
        pass

    assert g.__doc__ is None


def test_library_docstrings_are_filled():
    from tfdml import geometry, metrics
    from tfdml.data import numpy_augment

    for fn in (metrics.recall_at_k, metrics.map_at_r, metrics.r_precision, metrics.cmc,
               metrics.nmi, metrics.f1_clustering, metrics.vehicleid_match_rate,
               geometry.arc_distance, geometry.segment_squared_distance_from_dots,
               numpy_augment.resize, numpy_augment.center_crop):
        assert "{" + "QUERIES}" not in fn.__doc__ and "\n        {" not in fn.__doc__, fn
    assert "gallery_chunk_size: gallery items" in metrics.r_precision.__doc__
    assert "x2y1: dot product `x2 . y1`." in geometry.arc_similarity_from_dots.__doc__


# -- the documentation site's checks (docs/hooks.py runs them in `make docs`) ---------------


def test_every_public_name_is_on_an_api_page_with_a_docstring():
    import pathlib

    import tfdml
    from tfdml import _docs

    api = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api"
    pages = "\n".join(path.read_text() for path in sorted(api.glob("*.md")))
    absent, undocumented = _docs.missing_from_api(tfdml, pages)
    assert absent == [], f"public names on no page of docs/api/: {absent}"
    assert undocumented == [], f"public names without a docstring: {undocumented}"
    packages = {module.__name__ for module in _docs.public_packages(tfdml)}
    assert {"tfdml.losses", "tfdml.ops", "tfdml.compat.tfa", "tfdml.layers"} <= packages
    assert "tfdml.compat" not in packages  # its only public name is tfdml.compat.tfa


def test_a_missing_name_or_docstring_is_reported():
    import types

    from tfdml import _docs

    package = types.ModuleType("fake")
    package.__file__ = __file__
    package.documented = lambda: None
    package.documented.__doc__ = "Documented."
    package.bare = lambda: None
    package.__all__ = ["documented", "bare"]
    root = types.ModuleType("root")
    root.fake = package
    root.__all__ = ["fake"]
    absent, undocumented = _docs.missing_from_api(root, "::: fake.documented\n")
    assert absent == ["fake.bare"] and undocumented == ["fake.bare"]


def test_constants_are_documented_by_their_comment(tmp_path):
    import importlib.util

    from tfdml import _docs

    path = tmp_path / "constants_module.py"
    path.write_text("#: The first line\n#: and the second.\nVALUE = (1, 2)\n"
                    "OTHER = 2\n\"\"\"After it.\"\"\"\nBARE = 3\n")
    spec = importlib.util.spec_from_file_location("constants_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _docs.constant_doc(module, "VALUE") == "The first line and the second."
    assert _docs.documentation(module, "OTHER") == "After it."
    assert _docs.documentation(module, "BARE") == ""
