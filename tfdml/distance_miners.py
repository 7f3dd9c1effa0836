"""Deprecated: the distance miners live in :mod:`tfdml.miners` (``tfdml.miners.distance``,
``tfdml.miners.histogram``). Importing this module warns; its names still work."""

from __future__ import annotations

import warnings

from tfdml.miners.distance import AngularMiner, BatchEasyHardMiner, HDCMiner, TripletMarginMiner
from tfdml.miners.histogram import UniformHistogramMiner, histogram_bins, sample_per_bin
from tfdml.miners.pairs import PairMarginMiner

__all__ = ["AngularMiner", "BatchEasyHardMiner", "HDCMiner", "PairMarginMiner",
           "TripletMarginMiner", "UniformHistogramMiner", "histogram_bins", "sample_per_bin"]

warnings.warn("tfdml.distance_miners is deprecated: import the miners from tfdml.miners "
              "(histogram_bins and sample_per_bin from tfdml.miners.histogram).",
              DeprecationWarning, stacklevel=2)
