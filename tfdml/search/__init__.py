"""Nearest-neighbour search: the one exact search in tfdml, and an index to query, exact or
approximate.

:func:`neighbours` is the search every part of tfdml uses (the retrieval metrics
and callbacks too): queries are processed in chunks of ``chunk_size`` rows and
the gallery in chunks of ``gallery_chunk_size`` rows; each query chunk keeps a
*running* top-k that is merged with every gallery chunk's scores, so memory is
``chunk_size x (gallery_chunk_size + k)`` scores, whatever the number of queries
and gallery items. It is written in ``keras.ops`` and runs on the backend's
device.

:class:`Index` holds a gallery (embeddings, and optionally labels and ids) that
grows with :meth:`Index.add` (arrays or a generator of batches), answers
:meth:`Index.search` (scores and gallery indices), :meth:`Index.lookup` (with labels
and ids) and :meth:`Index.retrieve` (a :class:`RetrievalResults` to threshold,
re-rank with a :class:`PairReranker` and look at), and saves to one ``.npz`` file.
With ``approximate=`` (a faiss factory string) a faiss structure answers instead,
tuned by :meth:`Index.tune` to a recall of the exact neighbours.

Modules, from the bottom up: ``exact`` (:func:`neighbours`), ``approximate``
(faiss structures, and putting their candidates in order), ``store`` (the
embeddings, in memory or on disk), ``adding`` (the rows an index takes: checks,
host-side normalization, batches, training samples), ``results`` (:class:`Lookup`,
:class:`RetrievalResults`), ``calibration`` (:func:`calibrate`, :func:`match`),
``tuning`` (:class:`Tuning`, :func:`neighbour_recall`), ``index`` (:class:`Index`,
which composes them), ``persist`` (the file), ``rerank`` (:class:`PairReranker`).

Conventions:

* **Metrics.** ``"cosine"``: the dot product of L2-normalized vectors, larger
  is nearer; ``"dot"``: the plain dot product, larger is nearer; ``"l2"``:
  the Euclidean distance, smaller is nearer (the names of
  :data:`tfdml.ops.DISTANCES`). Scores are computed in float32.
* **Huge embeddings.** ``"cosine"`` normalizes every finite row exactly
  (:func:`tfdml.ops.l2_normalize`). For ``"l2"`` and ``"dot"``, rows so large
  that a float32 score could overflow (entries of about ``9e18 / sqrt(D)`` and
  above) are searched multiplied by a power of two (:func:`score_scale`),
  which changes no neighbour; their scores are scaled back in float64 and are
  Inf beyond the float32 range.
* **Ties.** Neighbours are ordered nearest first; items at equal scores by
  increasing gallery index. Results are exact and do not depend on the chunk
  sizes.
* **Non-finite embeddings** raise a ``ValueError`` that names the argument and
  the rows: a NaN would otherwise rank anywhere.
* **Query buckets.** JAX compiles every operation again for every new input
  shape (about a second and a half per new number of queries, on a CPU). With
  ``query_buckets`` each chunk of queries is padded with zero rows to
  :func:`query_bucket` rows (a power of two, at least :data:`MIN_BUCKET`, at
  most ``chunk_size``), so a service answering batches of varying sizes
  compiles a handful of shapes once, each as one program (``jax.jit``); the
  padding rows are dropped from the answers. :class:`Index` does this by
  default under JAX only: TensorFlow and PyTorch run these operations eagerly,
  without compiling (no ``tf.function``, no ``torch.compile``), so padding
  would only add work there.
"""


from tfdml._argument_checks import at_indices
from tfdml.search.calibration import (
    COPY_TOLERANCE,
    SELF_MATCH_SHARE,
    Calibration,
    calibrate,
    match,
    plot_calibration,
)
from tfdml.search.exact import (
    METRICS,
    MIN_BUCKET,
    check_finite,
    neighbours,
    nonfinite_rows,
    query_bucket,
    score_scale,
)
from tfdml.search.index import BACKENDS, VECTORS, Index
from tfdml.search.rerank import PairReranker
from tfdml.search.results import Lookup, RetrievalResults
from tfdml.search.tuning import Tuning, neighbour_recall

__all__ = ["BACKENDS", "COPY_TOLERANCE", "METRICS", "MIN_BUCKET", "SELF_MATCH_SHARE", "VECTORS",
           "Calibration", "Index", "Lookup", "PairReranker", "RetrievalResults", "Tuning", "at_indices",
           "calibrate", "check_finite", "match", "neighbour_recall", "neighbours",
           "nonfinite_rows", "plot_calibration", "query_bucket", "score_scale"]
