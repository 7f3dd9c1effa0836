"""Keras callbacks that evaluate embeddings during training.

* :class:`RecallAtK` writes Recall@K of a validation set into the epoch logs;
* :class:`KNNAccuracy` writes the k-NN classification accuracy of labelled queries
  against a labelled gallery into the epoch logs (self-supervised evaluation);
* :class:`TripletScatter` records the triplet scatter diagram of a data set
  (files, and the share of correct triplets in the logs);
* :class:`ActiveAnchorsWarning` warns when the batches give the loss nothing to
  learn from.
"""

from tfdml.callbacks.active_anchors import ActiveAnchorsWarning
from tfdml.callbacks.knn import KNNAccuracy
from tfdml.callbacks.recall import RecallAtK
from tfdml.callbacks.scatter import TripletScatter

__all__ = ["ActiveAnchorsWarning", "KNNAccuracy", "RecallAtK", "TripletScatter"]
