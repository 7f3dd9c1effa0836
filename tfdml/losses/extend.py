"""What a loss written outside tfdml needs, in one public module.

tfdml's own losses are written with these names and nothing else of the package's
internals, so a loss written with them behaves as the shipped ones do: the same checks of
``y_true`` and ``y_pred``, averages, reductions, row blocks, configs and ``.keras`` files.

* Bases: :class:`MetricLoss` (a loss is an ``__init__`` and ``terms(inputs)``),
  :class:`PairLoss` (``pair_losses(scores)``) and :class:`TripletLoss`
  (``triplet_loss(s_ap, s_an)``);
* the functional form of a class: :func:`functional_form`;
* inputs and terms: :class:`Inputs`, :class:`AnchorTerms`, :func:`anchor_terms`,
  :func:`pair_terms`, :func:`split_pair_terms`, :func:`triplet_terms`, :func:`pair_scores`;
* mining: :func:`resolve_miner` (the default miner for ``"default"``),
  :func:`mined_pairs`, :func:`mined_triplets`, :func:`gather_triplet_scores`;
* argument checks (a ValueError naming the argument): :func:`check_number`,
  :func:`check_int`, :func:`check_choice`, :func:`check_positive`;
* docstrings: :func:`fill_doc` and :func:`shared_args` (the shared arguments' ``Args``
  lines with the loss's defaults).

docs/extending.md ("Adding a loss") writes a loss with them.
"""

from __future__ import annotations

from tfdml._argument_checks import check_choice, check_int, check_number, check_positive
from tfdml._docs import fill_doc
from tfdml.losses._docstrings import shared_args
from tfdml.losses.base import MetricLoss
from tfdml.losses.functional import functional_form
from tfdml.losses.generic import PairLoss, TripletLoss, pair_scores
from tfdml.losses.inputs import Inputs, mined_pairs, mined_triplets, resolve_miner
from tfdml.losses.terms import (
    AnchorTerms,
    anchor_terms,
    pair_terms,
    split_pair_terms,
    triplet_terms,
)
from tfdml.miners import gather_triplet_scores

__all__ = [
    "AnchorTerms",
    "Inputs",
    "MetricLoss",
    "PairLoss",
    "TripletLoss",
    "anchor_terms",
    "check_choice",
    "check_int",
    "check_number",
    "check_positive",
    "fill_doc",
    "functional_form",
    "gather_triplet_scores",
    "mined_pairs",
    "mined_triplets",
    "pair_scores",
    "pair_terms",
    "resolve_miner",
    "shared_args",
    "split_pair_terms",
    "triplet_terms",
]
