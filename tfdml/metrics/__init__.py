"""Retrieval, verification and clustering metrics on embeddings.

Nearest neighbours are exact. Queries are processed in chunks of ``chunk_size``
rows and the gallery in chunks of ``gallery_chunk_size`` rows; each query chunk
keeps a *running* top-k that is merged with every gallery chunk's scores, so
memory is ``chunk_size x (gallery_chunk_size + k)`` scores, whatever the number
of queries and gallery items (60,000 x 512 embeddings need well under 2 GiB).

Conventions shared by every retrieval metric:

* **Similarity.** ``metric="cosine"`` (default) ranks by the dot product of
  L2-normalized embeddings; ``metric="l2"`` by the Euclidean distance (the
  names of :data:`tfdml.ops.DISTANCES`). Scores are computed in float32.
* **Self-exclusion.** Without a separate gallery every embedding is a query
  against all the others, itself excluded (CUB-200, Cars196, SOP protocol).
  The query is excluded by its index, not by its score, so no score (equal to
  another row's, ``-inf``, NaN) can make a query its own neighbour. With a
  gallery nothing is excluded (In-shop protocol).
* **Exclusions by group.** ``groups`` (``[Q]`` integer ids of the queries) and,
  with a separate gallery, ``gallery_groups`` (``[G]``) leave out of a query's
  ranking every gallery item of its group, by index as the query itself: such
  an item is neither a hit nor a miss and does not count in ``R`` (the
  ``sequence_ids`` of open-metric-learning: frames of one video, photos of one
  session). Without a gallery ``groups`` gives the group of every item. The
  search fetches ``k + m`` neighbours, ``m`` the most items left out of one
  query's ranking, and drops the left-out ones; a ``k`` must be at most the
  gallery size minus ``m``.
* **Non-finite embeddings.** Every metric raises a ``ValueError`` naming the
  argument when an embedding row holds a NaN or an Inf (after the conversion
  to float32, so float64 values beyond the float32 range count as Inf): a
  score computed on such rows would be meaningless, and a diverged model must
  not get a good one. :class:`tfdml.callbacks.RecallAtK` turns this into NaN
  log values instead of stopping the training.
* **Ties.** Neighbours are ordered by decreasing similarity; items with equal
  scores are ordered by increasing gallery index (a stable sort). Results are
  therefore deterministic and do not depend on the chunk sizes.
* **Queries without a match** (no other item of their class in the gallery, e.g.
  a class with a single sample): ``unmatched="miss"`` counts them as 0,
  ``unmatched="exclude"`` leaves them out of the average. The defaults follow
  each metric's definition: Recall@K and CMC average over *all* queries
  (``"miss"``, as in Song et al. 2016 and the FAPPY paper), MAP@R and
  R-precision are undefined for ``R = 0`` and leave such queries out
  (``"exclude"``, as in Musgrave et al. 2020 and pytorch-metric-learning), as
  do Precision@K and MAP@K (``"exclude"``, as open-metric-learning's
  ``validate_dataset`` asks). When every query is excluded the result is ``nan``.

:func:`fnmr_at_fmr` (verification over all pairs) and :func:`pcf` (the
principal-components fraction, a collapse indicator) live in
:mod:`tfdml.metrics.verification` and are re-exported here.

:func:`knn_accuracy` (:mod:`tfdml.metrics.knn`) is the k-NN classification accuracy of
queries against a labelled gallery (the evaluation of self-supervised embeddings); it
follows the same conventions, without self-exclusion or groups.

Keras metrics for ``model.compile``: :class:`ActiveAnchors`, the fraction of anchors of
the training batches that a tfdml loss learns from; :class:`OutputStd` and :class:`PCF`
(:mod:`tfdml.metrics.collapse`), collapse monitors that read only the embeddings (for
self-supervised training too).
"""

from tfdml.metrics._neighbours import (
    METRICS as METRICS,
)
from tfdml.metrics._neighbours import (
    UNMATCHED as UNMATCHED,
)
from tfdml.metrics._neighbours import (
    check_metric as check_metric,
)
from tfdml.metrics.active import ActiveAnchors
from tfdml.metrics.clustering import f1_clustering, nmi, nmi_score, pairwise_f1_score
from tfdml.metrics.collapse import PCF
from tfdml.metrics.knn import knn_accuracy
from tfdml.metrics.retrieval import (
    cmc,
    map_at_k,
    map_at_r,
    precision_at_k,
    r_precision,
    recall_at_k,
    vehicleid_match_rate,
)
from tfdml.metrics.verification import fnmr_at_fmr, pcf
from tfdml.models.monitors import OutputStd

__all__ = [
    "PCF",
    "ActiveAnchors",
    "OutputStd",
    "cmc",
    "f1_clustering",
    "fnmr_at_fmr",
    "knn_accuracy",
    "map_at_k",
    "map_at_r",
    "nmi",
    "nmi_score",
    "pairwise_f1_score",
    "pcf",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "vehicleid_match_rate",
]
