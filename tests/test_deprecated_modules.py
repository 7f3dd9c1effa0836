"""Modules that moved keep working, with a DeprecationWarning: ``tfdml.distance_miners``
(now in ``tfdml.miners``) and ``tfdml.metric_model`` (now ``tfdml.models`` and
``tfdml.losses.ownership``)."""

from __future__ import annotations

import importlib
import sys

import pytest

import tfdml


@pytest.mark.parametrize("name, moved", [
    ("tfdml.distance_miners", {"TripletMarginMiner": tfdml.miners.TripletMarginMiner,
                               "UniformHistogramMiner": tfdml.miners.UniformHistogramMiner}),
    ("tfdml.metric_model", {"MetricModel": tfdml.models.MetricModel}),
])
def test_the_old_module_warns_and_gives_the_same_objects(name, moved):
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=name.replace(".", r"\.")):
        module = importlib.import_module(name)
    for attribute, obj in moved.items():
        assert getattr(module, attribute) is obj
    assert set(moved) <= set(module.__all__)
