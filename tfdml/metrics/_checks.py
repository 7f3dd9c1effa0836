"""Checks shared by the metric modules: labelings that must be finite, and the ``Raises``
entry of the metrics that refuse non-finite embeddings."""

from __future__ import annotations

import textwrap

import numpy as np

from tfdml.search import at_indices

__all__ = ["check_finite_labeling", "nonfinite_raises"]


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


def check_finite_labeling(values, name):
    """Raises a ValueError naming ``name`` when a float labeling holds a NaN or an Inf.

    Args:
        values: an array-like of ids (class ids, cluster ids, group ids).
        name: the argument's name, for the message.

    Raises:
        ValueError: ``values`` has a floating dtype and holds a NaN or an Inf; the
            message gives their number and positions.
    """
    values = np.asarray(values)
    if np.issubdtype(values.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        if len(bad):
            what = "value" if len(bad) == 1 else "values"
            raise ValueError(
                f"`{name}` contains {len(bad)} non-finite {what} (NaN or Inf); it must hold "
                f"integer ids. Received: {name} with non-finite {what} at {at_indices(bad)}"
            )
