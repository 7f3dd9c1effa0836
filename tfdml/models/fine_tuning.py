"""Fine-tuning a backbone: its layers, its transformer blocks, and what to freeze or train slower.

* :func:`all_layers` walks every layer of a model, nested ones too;
* :func:`freeze_batchnorm_layers` freezes its BatchNormalization layers;
* :func:`transformer_blocks` finds the patch embedding and the transformer blocks of the
  keras-hub vision transformers (ViT, DINOv2, DINOv3, CLIP, SigLIP) inside a model;
* :func:`freeze_transformer_blocks` freezes the embedding and the first blocks;
* :func:`layerwise_lr_decay` gives each trainable variable its learning-rate multiplier,
  lower for the layers nearer the input, as the ViT fine-tuning recipes of BEiT and MAE
  do; :class:`tfdml.models.LearningRateMultipliers` applies them.
"""

from __future__ import annotations

import keras

from tfdml._argument_checks import check_int, check_number

__all__ = [
    "all_layers",
    "freeze_batchnorm_layers",
    "freeze_transformer_blocks",
    "layerwise_lr_decay",
    "transformer_blocks",
]

#: The keras-hub layer classes, by name, that embed the patches (with the class, register
#: and position embeddings) of the vision transformers keras-hub ships.
EMBEDDING_CLASSES = frozenset({
    "ViTPatchingAndEmbedding",
    "DINOV2Embedding",
    "DINOV3Embedding",
    "CLIPVisionEmbedding",
    "SigLIPVisionEmbedding",
})

#: Their transformer blocks (one attention and one MLP sub-block each).
BLOCK_CLASSES = frozenset({
    "ViTEncoderBlock",
    "DINOV2Layer",
    "DINOV3Layer",
    "CLIPEncoderLayer",
    "SigLIPEncoderLayer",
})

#: A layer of that name (CLIP's LayerNorm before the first block) belongs to the embedding.
_EMBEDDING_NAME_SUFFIXES = ("pre_layer_norm",)


def all_layers(layer):
    """``layer`` and every layer nested in it, once each, parents first.

    Walks Keras' public structure: a model's ``layers``, and the layers a layer holds in
    its public attributes (directly or in a list, tuple or dict).
    """
    seen, order, pending = set(), [], [layer]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        order.append(current)
        children = list(current.layers) if isinstance(current, keras.Model) else []
        for name, value in vars(current).items():
            if name.startswith("_"):
                continue
            values = value.values() if isinstance(value, dict) else (
                value if isinstance(value, (list, tuple)) else [value])
            children.extend(v for v in values if isinstance(v, keras.layers.Layer))
        pending.extend(reversed(children))
    return order


def freeze_batchnorm_layers(model: keras.Model) -> list:
    """Sets ``trainable=False`` on every BatchNormalization layer of ``model``, nested too.

    In Keras 3 a BatchNormalization layer with ``trainable=False`` runs in
    inference mode (it normalizes with its moving mean and variance, which
    stop updating) and its ``gamma`` and ``beta`` are not trained. Every other
    layer keeps its ``trainable`` flag.

    Args:
        model: a Keras model or layer.

    Returns:
        The list of layers frozen.
    """
    frozen = []
    for layer in all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
            frozen.append(layer)
    return frozen


def _class_names(layer):
    return {cls.__name__ for cls in type(layer).__mro__}


def transformer_blocks(model) -> tuple[list, list]:
    """The embedding layers and the transformer blocks of a keras-hub vision transformer.

    Finds them anywhere in ``model`` (a keras-hub backbone, or a model that nests one,
    such as :func:`build_embedding_model`'s), by their keras-hub classes: the patch
    embedding (``ViTPatchingAndEmbedding``, ``DINOV2Embedding``, ``DINOV3Embedding``,
    ``CLIPVisionEmbedding``, ``SigLIPVisionEmbedding``, which hold the class, register
    and position embeddings too, plus CLIP's ``pre_layer_norm``) and the blocks
    (``ViTEncoderBlock``, ``DINOV2Layer``, ``DINOV3Layer``, ``CLIPEncoderLayer``,
    ``SigLIPEncoderLayer``), in the order the model runs them. It survives a ``.keras``
    save and load.

    Args:
        model: a Keras model or layer.

    Returns:
        ``(embeddings, blocks)``: two lists of layers, ``blocks`` input side first.

    Raises:
        ValueError: no transformer block in ``model`` (a CNN, or a model whose block
            classes are unknown).
    """
    embeddings, blocks = [], []
    for layer in all_layers(model):
        names = _class_names(layer)
        if names & BLOCK_CLASSES:
            blocks.append(layer)
        elif names & EMBEDDING_CLASSES or layer.name.endswith(_EMBEDDING_NAME_SUFFIXES):
            embeddings.append(layer)
    if not blocks:
        raise ValueError(
            f"Model {getattr(model, 'name', model)!r} holds no transformer block of a keras-hub "
            f"vision transformer (classes {', '.join(sorted(BLOCK_CLASSES))}): block freezing "
            "and layer-wise learning-rate decay apply to ViT, DINOv2, DINOv3, CLIP and SigLIP "
            "backbones."
        )
    return embeddings, blocks


def freeze_transformer_blocks(model, num_blocks: int) -> list:
    """Freezes the patch embedding and the first ``num_blocks`` transformer blocks.

    Sets ``trainable=False`` on the layers :func:`transformer_blocks` finds: the
    embedding layers and blocks ``0 .. num_blocks - 1`` (input side first). The
    later blocks, the final LayerNorm and the head keep their flag. ``num_blocks=0``
    freezes nothing (whatever the model).

    Args:
        model: a model holding a keras-hub vision transformer.
        num_blocks: how many blocks to freeze, from 0 to the number of blocks.

    Returns:
        The layers frozen.

    Raises:
        ValueError: ``num_blocks`` is not an integer in that range, or ``model`` holds
            no transformer block.
    """
    num_blocks = check_int("num_blocks", num_blocks, minimum=0)
    if num_blocks == 0:
        return []
    embeddings, blocks = transformer_blocks(model)
    if num_blocks > len(blocks):
        raise ValueError(
            f"`num_blocks` must be at most the number of transformer blocks ({len(blocks)}). "
            f"Received: num_blocks={num_blocks}"
        )
    frozen = embeddings + blocks[:num_blocks]
    for layer in frozen:
        layer.trainable = False
    return frozen


def layerwise_lr_decay(model, decay: float) -> dict:
    """Per-variable learning-rate multipliers that decay from the head down to the input.

    The layer-wise learning-rate decay of BEiT (Bao et al., 2022) and MAE (He et al.,
    2022) for fine-tuning a vision transformer of ``L`` blocks: block ``i`` (``0`` the
    nearest the input) trains at ``decay ** (L - i)`` times the base learning rate, the
    patch embedding (with the class, register and position embeddings) at
    ``decay ** (L + 1)``, and everything after the last block (the final LayerNorm,
    the pooling, the embedding head) at the full rate, multiplier ``1``. BEiT uses
    ``decay`` 0.65 for its base model, MAE 0.75 (ViT-B) and 0.65 (ViT-L).

    Pass the result to :class:`tfdml.models.LearningRateMultipliers` with the
    optimizer. The keys are variable paths (``variable.path``), which are the same after
    a ``.keras`` save and load and under every backend.

    Args:
        model: a model holding a keras-hub vision transformer (see
            :func:`transformer_blocks`).
        decay: the factor per block, ``0 < decay <= 1`` (``1``: no decay).

    Returns:
        ``{variable.path: multiplier}`` for every weight of ``model``: those of layers
        frozen at the moment too (they get theirs when unfrozen), and non-trainable
        ones, which the optimizer never updates.

    Raises:
        ValueError: ``decay`` out of range, no transformer block in ``model``, or two
            variables with the same path and different multipliers.

    Examples:

    >>> multipliers = tfdml.models.layerwise_lr_decay(model, 0.65)
    >>> optimizer = tfdml.models.LearningRateMultipliers(
    ...     keras.optimizers.AdamW(5e-4, weight_decay=0.05), multipliers)
    """
    check_number("decay", decay, low=0, high=1, low_open=True)
    embeddings, blocks = transformer_blocks(model)
    depth = len(blocks)
    scale = {}
    for layer in embeddings:
        for v in layer.weights:
            scale.setdefault(id(v), float(decay) ** (depth + 1))
    for i, layer in enumerate(blocks):
        for v in layer.weights:
            scale.setdefault(id(v), float(decay) ** (depth - i))
    multipliers = {}
    for v in model.weights:
        m = scale.get(id(v), 1.0)
        if multipliers.get(v.path, m) != m:
            raise ValueError(
                f"Two variables of the model have the path {v.path!r} and different "
                "learning-rate multipliers: rename one of their layers."
            )
        multipliers[v.path] = m
    return multipliers
