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
