"""Embedding models and the model that trains them with a tfdml loss.

* :mod:`tfdml.models.backbones`: ``backbone -> global pooling -> Dense -> L2
  normalize`` networks from a Keras Applications name (or ResNet18,
  :mod:`tfdml.models.resnet`), and how each backbone expects its pixels;
* :mod:`tfdml.models.hub`: the same from a keras-hub backbone (ViT, DINOv2, CLIP,
  SigLIP, ...), with :mod:`tfdml.models.fine_tuning` to freeze its first blocks or give each
  block its learning rate (layer-wise decay), applied by
  :class:`LearningRateMultipliers` (:mod:`tfdml.models.optimizers`);
* :class:`MetricModel` (:mod:`tfdml.models.metric_model`): an embedding model
  trained with a tfdml loss, owning the loss's state, with the network in
  chunks (:mod:`tfdml.models.gradient_cache`, one step per backend) and
  files written whole (:mod:`tfdml.models.saving`);
* :class:`ContrastiveModel` (:mod:`tfdml.models.contrastive_model`): a backbone trained
  without labels on two views of each sample (SimCLR, SimSiam, Barlow Twins, VICReg, BYOL,
  MoCo), with the heads of :mod:`tfdml.models.heads`;
* :func:`save_model` / :func:`load_model` (:mod:`tfdml.models.files`).

Lower layers (ops, miners, losses) never import this package.
"""

from __future__ import annotations

from tfdml.models.backbones import BACKBONES, build_embedding_model, get_preprocess, preprocess_mode
from tfdml.models.contrastive_model import ContrastiveModel
from tfdml.models.files import load_model, save_model
from tfdml.models.fine_tuning import (
    all_layers,
    freeze_batchnorm_layers,
    freeze_transformer_blocks,
    layerwise_lr_decay,
    transformer_blocks,
)
from tfdml.models.heads import build_predictor, build_projector
from tfdml.models.hub import HUB_BACKBONES, TokenPooling
from tfdml.models.metric_model import MetricModel, is_stateful_loss, plus_model_losses, unwrap
from tfdml.models.optimizers import LearningRateMultipliers
from tfdml.models.resnet import resnet18
from tfdml.models.weights import WeightsUnavailableError

__all__ = [
    "BACKBONES",
    "ContrastiveModel",
    "HUB_BACKBONES",
    "LearningRateMultipliers",
    "MetricModel",
    "TokenPooling",
    "WeightsUnavailableError",
    "all_layers",
    "build_embedding_model",
    "build_predictor",
    "build_projector",
    "freeze_batchnorm_layers",
    "freeze_transformer_blocks",
    "get_preprocess",
    "is_stateful_loss",
    "layerwise_lr_decay",
    "load_model",
    "plus_model_losses",
    "preprocess_mode",
    "resnet18",
    "save_model",
    "transformer_blocks",
    "unwrap",
]
