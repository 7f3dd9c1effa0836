"""keras-hub backbones in build_embedding_model: families, pooling, preprocessing, presets,
freezing, layer-wise learning-rate decay and the optimizer that applies it.

Every backbone is a tiny random configuration (32x32 images, patch 8, 2 blocks, width 16):
nothing is downloaded. Fit steps run eagerly (``run_eagerly=True``: tracing a keras-hub
backbone costs ~10 s on 2 cores under TensorFlow); the optimizer's compiled path is tested
on a small Dense model. The tests marked ``multibackend`` also run under JAX and PyTorch.
"""

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import tfdml  # noqa: E402
from tfdml import models  # noqa: E402
from tfdml.layers import GeneralizedMeanPooling2D  # noqa: E402
from tfdml.models import LearningRateMultipliers, TokenPooling  # noqa: E402
from tfdml.models.hub import hub_preset, import_keras_hub  # noqa: E402

MB = pytest.mark.multibackend
KH = keras_hub.models
SIZE = 32
LABELS = np.repeat(np.arange(4), 2).astype("int32")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def _tiny(family, **kwargs):
    size = dict(num_layers=2, num_heads=2, hidden_dim=16)
    shape = (SIZE, SIZE, 3)
    if family == "vit":
        return KH.ViTBackbone(image_shape=shape, patch_size=8, mlp_dim=32, **size, **kwargs)
    if family == "dinov2":
        return KH.DINOV2Backbone(patch_size=8, intermediate_dim=32, image_shape=shape,
                                 position_embedding_shape=shape, **size, **kwargs)
    if family == "clip":
        return KH.CLIPVisionEncoder(patch_size=8, intermediate_dim=32, image_shape=shape,
                                    **size, **kwargs)
    if family == "siglip":
        return KH.SigLIPVisionEncoder(patch_size=8, intermediate_dim=32, image_shape=shape,
                                      **size, **kwargs)
    return KH.ResNetBackbone(  # keras-hub's ResNet starts with 64 filters
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 16],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
        image_shape=shape)


def _images(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, SIZE, SIZE, 3)).astype("float32")


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _fit_step(model, optimizer=None):
    model.compile(optimizer=optimizer or keras.optimizers.AdamW(1e-3),
                  loss=tfdml.losses.MultiSimilarityLoss(miner=None), run_eagerly=True)
    return float(model.train_on_batch(_images(), LABELS))


# -- families --------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Gradients do not exist for variables")  # DINOv2's mask token
@pytest.mark.parametrize("family, pool", [
    ("vit", "cls_pool"), ("dinov2", "cls_pool"), ("clip", "cls_pool"), ("siglip", None),
    ("resnet", "gem_pool"),
])
def test_each_family_embeds_and_trains_with_a_tfdml_loss(family, pool):
    keras.utils.set_random_seed(1)
    base = _tiny(family)
    model = models.build_embedding_model(base, embedding_dim=8)
    names = [layer.name for layer in model.layers]
    assert names == ["images", "preprocessing", base.name] + ([pool] if pool else []) + [
        "embedding", "l2_normalization"]
    assert model.name == f"{base.name}_embedding" and model.backbone_name == base.name
    assert model.preprocess == "none" and model.input_shape == (None, SIZE, SIZE, 3)
    out = _numpy(model(_images()))
    assert out.shape == (8, 8)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)

    before = [np.array(w) for w in base.trainable_weights]
    loss = _fit_step(model)
    assert np.isfinite(loss) and loss > 0
    assert any(not np.array_equal(b, np.array(a))
               for b, a in zip(before, base.trainable_weights, strict=True))


def test_default_pooling_per_family_and_the_class_token_after_registers():
    dino = models.build_embedding_model(_tiny("dinov2", num_register_tokens=2), 8)
    assert dino.get_layer("cls_pool").get_config()["num_prefix_tokens"] == 3
    mean = models.build_embedding_model(_tiny("dinov2", num_register_tokens=2), 8,
                                        pooling="mean")
    assert mean.get_layer("mean_pool").num_prefix_tokens == 3
    avg = models.build_embedding_model(_tiny("clip"), 8, pooling="avg")
    assert avg.get_layer("mean_pool").mode == "mean"
    no_cls = models.build_embedding_model(_tiny("vit", use_class_token=False), 8)
    assert no_cls.get_layer("mean_pool").num_prefix_tokens == 0
    cnn = models.build_embedding_model(_tiny("resnet"), 8, pooling="avg")
    assert isinstance(cnn.get_layer("avg_pool"), keras.layers.GlobalAveragePooling2D)
    fixed = GeneralizedMeanPooling2D(p=4.0, learnable=False, name="my_gem")
    assert models.build_embedding_model(_tiny("resnet"), 8, pooling=fixed).get_layer(
        "my_gem") is fixed


def test_token_pooling_matches_numpy():
    x = np.random.default_rng(2).normal(size=(2, 7, 4)).astype("float32")
    np.testing.assert_allclose(_numpy(TokenPooling("cls")(x)), x[:, 0])
    np.testing.assert_allclose(_numpy(TokenPooling("mean", 3)(x)), x[:, 3:].mean(1), rtol=1e-6)
    np.testing.assert_allclose(_numpy(TokenPooling("max", 0)(x)), x.max(1))
    for bad in ({"mode": "gem"}, {"num_prefix_tokens": -1}, {"mode": "cls", "num_prefix_tokens": 0}):
        with pytest.raises(ValueError, match="Received"):
            TokenPooling(**bad)


def test_siglip_mean_pools_the_tokens_before_its_attention_head():
    base = _tiny("siglip")
    model = models.build_embedding_model(base, embedding_dim=None, normalize=False,
                                         pooling="mean")
    assert f"{base.name}_tokens" in [layer.name for layer in model.layers]
    images = _images(2)
    tokens = keras.Model(base.input, base.post_layer_norm.output)(
        {"images": model.get_layer("preprocessing")(images)})
    np.testing.assert_allclose(_numpy(model(images)), _numpy(tokens).mean(1), atol=1e-5)
    assert not any("head" in w.path for w in model.weights)


@pytest.mark.parametrize("family, pooling", [("siglip", "cls"), ("vit", "gem"),
                                             ("resnet", "cls"), ("vit", "median")])
def test_pooling_the_family_does_not_have_is_refused(family, pooling):
    with pytest.raises(ValueError, match=rf"`pooling` for a .*Received: pooling='{pooling}'"):
        models.build_embedding_model(_tiny(family), 8, pooling=pooling)


# -- preprocessing -----------------------------------------------------------------------------


def test_normalization_is_in_the_model_and_takes_0_255_pixels():
    white = np.full((1, SIZE, SIZE, 3), 255.0, "float32")
    clip_mean = np.array([0.48145466, 0.4578275, 0.40821073])
    clip_std = np.array([0.26862954, 0.26130258, 0.27577711])
    for family, mean, std in (("dinov2", IMAGENET_MEAN, IMAGENET_STD), ("vit", 0.5, 0.5),
                              ("clip", clip_mean, clip_std), ("siglip", 0.5, 0.5),
                              ("resnet", IMAGENET_MEAN, IMAGENET_STD)):
        layer = models.build_embedding_model(_tiny(family), 8).get_layer("preprocessing")
        np.testing.assert_allclose(_numpy(layer(white))[0, 0, 0], (1 - mean) / std * np.ones(3),
                                   rtol=1e-5, err_msg=family)
    for name in ("dinov2_small", "clip_vit_b16", "siglip_base_patch16_224"):
        assert models.preprocess_mode(name) == "none"
    assert models.get_preprocess("vit_base_patch16_224").mode == "none"


# -- presets -----------------------------------------------------------------------------------


def test_build_from_a_local_preset_directory(tmp_path):
    vit = _tiny("vit")
    vit.save_to_preset(str(tmp_path / "vit"))
    keras_hub.layers.ViTImageConverter(image_size=(SIZE, SIZE), scale=1 / 255.0,
                                       offset=[-1.0, -2.0, -3.0]).save_to_preset(
        str(tmp_path / "vit"))
    model = models.build_embedding_model(str(tmp_path / "vit"), 8)
    assert model.backbone_name == str(tmp_path / "vit")
    loaded = model.get_layer(vit.name)
    for expected, got in zip(vit.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(np.array(got), np.array(expected))
    layer = model.get_layer("preprocessing")  # the preset's image converter
    np.testing.assert_allclose(layer.scale, 1 / 255.0)
    np.testing.assert_allclose(layer.offset, [-1.0, -2.0, -3.0])
    random = models.build_embedding_model(str(tmp_path / "vit"), 8, weights=None)
    assert not np.array_equal(np.array(random.get_layer(vit.name).weights[1]),
                              np.array(vit.weights[1]))

    siglip = _tiny("siglip")  # no image converter in the preset: the family's normalization
    siglip.save_to_preset(str(tmp_path / "siglip"))
    scale = models.build_embedding_model(str(tmp_path / "siglip"), 8).get_layer(
        "preprocessing").scale
    np.testing.assert_allclose(scale, [1 / 127.5] * 3)
    with pytest.raises(ValueError, match="`input_shape` must agree"):
        models.build_embedding_model(str(tmp_path / "siglip"), 8, input_shape=(64, 64, 3))


def test_every_hub_name_is_a_keras_hub_preset_of_its_class():
    assert len(models.HUB_BACKBONES) >= 20
    for name in models.HUB_BACKBONES:
        spec = models.hub._HUB[name]
        assert spec.preset in getattr(KH, spec.backbone_class).presets, name
        assert hub_preset(name.upper()) == spec.preset
    assert not set(models.HUB_BACKBONES) & set(models.BACKBONES)
    # a fixed-size transformer is refused at another size before anything is downloaded
    with pytest.raises(ValueError, match=r"`input_shape` for backbone 'vit_base_patch16_224'"):
        models.build_embedding_model("vit_base_patch16_224", input_shape=(SIZE, SIZE, 3))


def test_a_preset_that_cannot_be_downloaded_says_what_to_do(monkeypatch):
    def offline(cls, preset, **kwargs):
        raise OSError("Failed to resolve 'api.kaggle.com'")

    monkeypatch.setattr(keras_hub.layers.ImageConverter, "from_preset", classmethod(offline))
    with pytest.raises(models.WeightsUnavailableError, match=r"'dinov2_small'.*save_to_preset"):
        models.build_embedding_model("dinov2_small")

    def missing(cls, preset, **kwargs):
        raise FileNotFoundError("no image_converter.json")

    monkeypatch.setattr(keras_hub.layers.ImageConverter, "from_preset", classmethod(missing))
    monkeypatch.setattr(KH.Backbone, "from_preset", classmethod(offline))
    with pytest.raises(models.WeightsUnavailableError, match="kagglehub cache"):
        models.build_embedding_model("clip_vit_b16")


# -- freezing ----------------------------------------------------------------------------------


def test_trainable_backbone_and_freeze_blocks():
    base = _tiny("vit")
    probe = models.build_embedding_model(base, 8, trainable_backbone=False)
    assert not base.trainable and base.trainable_weights == []
    assert {w.path for w in probe.trainable_weights} == {"embedding/kernel", "embedding/bias"}

    base = _tiny("vit")
    model = models.build_embedding_model(base, 8, freeze_blocks=1)
    embeddings, blocks = models.transformer_blocks(model)
    assert [b.name for b in blocks] == ["transformer_block_1", "transformer_block_2"]
    assert [e.name for e in embeddings] == ["vit_patching_and_embedding"]
    assert not embeddings[0].trainable and not blocks[0].trainable and blocks[1].trainable
    assert base.get_layer("vit_encoder").layer_norm.trainable
    assert models.freeze_transformer_blocks(_tiny("clip"), 0) == []

    resnet18 = models.build_embedding_model("resnet18", 8, (SIZE, SIZE, 3), weights=None,
                                            trainable_backbone=False)
    assert len(resnet18.trainable_weights) == 2
    with pytest.raises(ValueError, match="must be at most the number of transformer blocks"):
        models.build_embedding_model(_tiny("vit"), 8, freeze_blocks=3)
    with pytest.raises(ValueError, match="holds no transformer block"):
        models.build_embedding_model(_tiny("resnet"), 8, freeze_blocks=1)
    for kwargs, arg in (({"freeze_blocks": -1}, "freeze_blocks"),
                        ({"freeze_blocks": True}, "freeze_blocks"),
                        ({"trainable_backbone": "no"}, "trainable_backbone")):
        with pytest.raises(ValueError, match=rf"`{arg}`.*Received: {arg}="):
            models.build_embedding_model(_tiny("vit"), 8, **kwargs)


# -- layer-wise learning-rate decay --------------------------------------------------------------


def test_layerwise_lr_decay_multipliers_per_block():
    base = _tiny("clip")
    model = models.build_embedding_model(base, 8)
    multipliers = models.layerwise_lr_decay(model, 0.5)
    assert set(multipliers) == {w.path for w in model.weights}
    groups = {}
    for path, m in multipliers.items():
        groups.setdefault(path if path.startswith("embedding/") else path.split("/")[0],
                          set()).add(m)
    assert groups == {  # CLIP's patch embedding layer is "embedding", the head's Dense too
        "embedding/class_embedding": {0.125}, "embedding/patch_embedding/kernel": {0.125},
        "embedding/position_embedding/embeddings": {0.125}, "embedding/position_ids": {0.125},
        "pre_layer_norm": {0.125}, "encoder_block_0": {0.25}, "encoder_block_1": {0.5},
        "layer_norm": {1.0}, "embedding/kernel": {1.0}, "embedding/bias": {1.0}}

    dino = models.layerwise_lr_decay(_tiny("dinov2", num_register_tokens=1), 0.75)
    assert dino["embeddings/register_tokens"] == pytest.approx(0.75 ** 3)
    assert {dino[p] for p in dino if p.startswith("encoder/layers_1/")} == {0.75}
    assert dino["layernorm/gamma"] == 1.0
    assert set(models.layerwise_lr_decay(model, 1.0).values()) == {1.0}
    for decay in (0, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"`decay`.*Received: decay="):
            models.layerwise_lr_decay(model, decay)
    with pytest.raises(ValueError, match="holds no transformer block"):
        models.layerwise_lr_decay(_tiny("resnet"), 0.5)


def _grads(variables, seed):
    rng = np.random.default_rng(seed)
    return [keras.ops.convert_to_tensor(rng.normal(size=v.shape).astype("float32"))
            for v in variables]


@MB
def test_adamw_with_layerwise_decay_scales_each_blocks_update():
    """Step 1: each variable moves by its block's multiplier times the plain AdamW step
    (weight decay included). Two steps: the same as one AdamW per block at ``lr * m``, the
    per-parameter-group learning rates of BEiT and MAE."""
    keras.utils.set_random_seed(3)
    model = models.build_embedding_model(_tiny("vit"), 8)
    decay, lr = 0.5, 1e-2
    multipliers = models.layerwise_lr_decay(model, decay)
    variables = model.trainable_variables
    start = [np.array(v) for v in variables]

    def run(apply, steps):
        for v, value in zip(variables, start, strict=True):
            v.assign(value)
        for step in range(steps):
            apply(_grads(variables, step))
        return [np.array(v) - s for v, s in zip(variables, start, strict=True)]

    plain_opt = keras.optimizers.AdamW(lr, weight_decay=0.5)
    plain = run(lambda g: plain_opt.apply(g, variables), 1)
    wrapped = LearningRateMultipliers(keras.optimizers.AdamW(lr, weight_decay=0.5), multipliers)
    scaled = run(lambda g: wrapped.apply(g, variables), 1)
    ratios = {}
    for v, p, s in zip(variables, plain, scaled, strict=True):
        np.testing.assert_allclose(s, multipliers[v.path] * p, rtol=1e-4, atol=3e-7,
                                   err_msg=v.path)
        parts = v.path.split("/")
        ratios[parts[1] if parts[0] == "vit_encoder" else parts[0]] = multipliers[v.path]
    assert ratios == {"vit_patching_and_embedding": decay ** 3,
                      "transformer_block_1": decay ** 2, "transformer_block_2": decay,
                      "ln": 1.0, "embedding": 1.0}

    groups = {m: keras.optimizers.AdamW(lr * m, weight_decay=0.5)
              for m in set(multipliers.values())}

    def per_group(grads):
        for m, optimizer in groups.items():
            chosen = [i for i, v in enumerate(variables) if multipliers[v.path] == m]
            if chosen:
                optimizer.apply([grads[i] for i in chosen], [variables[i] for i in chosen])

    reference = run(per_group, 2)
    wrapped = LearningRateMultipliers(keras.optimizers.AdamW(lr, weight_decay=0.5), multipliers)
    two_steps = run(lambda g: wrapped.apply(g, variables), 2)
    for v, r, s in zip(variables, reference, two_steps, strict=True):
        np.testing.assert_allclose(s, r, rtol=1e-4, atol=3e-7, err_msg=v.path)


@MB
def test_learning_rate_multipliers_in_a_compiled_fit():
    """The compiled train step (tf.function, jax.jit's stateless apply, torch): each
    variable moves by its multiplier times the plain AdamW step, weight decay included."""
    x = np.random.default_rng(4).normal(size=(16, 4)).astype("float32")
    y = np.random.default_rng(5).normal(size=(16, 2)).astype("float32")

    def model(optimizer):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        net = keras.Model(inputs, keras.layers.Dense(2, name="b")(
            keras.layers.Dense(3, name="a")(inputs)))
        net.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        return net

    plain = model(keras.optimizers.AdamW(1e-2, weight_decay=0.3))
    start = [np.array(v) for v in plain.trainable_variables]
    plain.fit(x, y, batch_size=16, epochs=1, verbose=0)
    multipliers = {"a/kernel": 0.25, "a/bias": 0.0, "b/kernel": 2.0}
    wrapped = model(LearningRateMultipliers(keras.optimizers.AdamW(1e-2, weight_decay=0.3),
                                            multipliers))
    wrapped.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(_numpy(wrapped.optimizer.iterations)) == 1
    for v, ref, s in zip(wrapped.trainable_variables, plain.trainable_variables, start,
                         strict=True):
        m = multipliers.get(v.path, 1.0)
        np.testing.assert_allclose(np.array(v) - s, m * (np.array(ref) - s), rtol=1e-3,
                                   atol=1e-6, err_msg=v.path)
    np.testing.assert_array_equal(np.array(wrapped.get_layer("a").bias), start[1])


@MB
def test_trained_hub_model_with_multipliers_round_trips_through_keras_file(tmp_path):
    keras.utils.set_random_seed(6)
    # Not DINOv2: keras-hub 0.32 saves its fine-tuned position embeddings only when their
    # sum went down (DINOV2Embedding._is_interpolated_position_embeddings_updated).
    model = models.build_embedding_model(_tiny("clip"), 8, pooling="mean")
    multipliers = models.layerwise_lr_decay(model, 0.5)
    optimizer = LearningRateMultipliers(keras.optimizers.AdamW(1e-3, weight_decay=0.05),
                                        multipliers)
    assert np.isfinite(_fit_step(model, optimizer))
    path = tmp_path / "hub.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    images = _images(3, seed=7)
    np.testing.assert_allclose(_numpy(loaded(images)), _numpy(model(images)), atol=1e-6)
    assert isinstance(loaded.optimizer, LearningRateMultipliers)
    assert isinstance(loaded.optimizer.inner_optimizer, keras.optimizers.AdamW)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_allclose(_numpy(a), _numpy(b), err_msg=a.path)
    # The nested variables' paths may change on loading (keras-hub builds its layers in its
    # constructor): the multipliers come back in the order of the optimizer's variables.
    pairs = list(zip(loaded.trainable_variables, model.trainable_variables, strict=True))
    assert [loaded.optimizer.multiplier(a) for a, _ in pairs] == [
        multipliers[b.path] for _, b in pairs]
    assert len({loaded.optimizer.multiplier(a) for a, _ in pairs}) == 4
    grads = _grads(model.trainable_variables, 8)
    model.optimizer.apply(grads, model.trainable_variables)
    loaded.optimizer.apply(grads, loaded.trainable_variables)
    for a, b in pairs:
        np.testing.assert_allclose(_numpy(a), _numpy(b), atol=1e-6, err_msg=b.path)


def test_learning_rate_multipliers_delegates_and_checks():
    inner = keras.optimizers.AdamW(1e-3)
    optimizer = LearningRateMultipliers(inner, {"a/kernel": 0.5})
    optimizer.learning_rate = 2e-3
    assert float(_numpy(inner.learning_rate)) == pytest.approx(2e-3)
    assert float(_numpy(optimizer.learning_rate)) == pytest.approx(2e-3)
    config = keras.optimizers.serialize(optimizer)
    again = keras.optimizers.deserialize(config)
    assert isinstance(again, LearningRateMultipliers) and again.multipliers == {"a/kernel": 0.5}
    assert again.inner_optimizer.get_config() == inner.get_config()
    with pytest.raises(ValueError, match="`optimizer` must be a keras.optimizers.Optimizer"):
        LearningRateMultipliers("adamw", {})
    with pytest.raises(ValueError, match="use_ema"):
        LearningRateMultipliers(keras.optimizers.SGD(use_ema=True), {})
    for bad in ([0.5], {"a": -1.0}, {"a": float("nan")}, {3: 1.0}):
        with pytest.raises(ValueError, match="`multipliers`"):
            LearningRateMultipliers(keras.optimizers.SGD(), bad)
    with pytest.raises(ValueError, match="`multipliers`"):
        LearningRateMultipliers(keras.optimizers.SGD(), {}, ordered_multipliers=[1.0, -2.0])
    restored = LearningRateMultipliers(keras.optimizers.SGD(), {"x/kernel": 0.5},
                                       ordered_multipliers=[0.25, 0.5, 1.0])
    variables = [keras.Variable(np.zeros(2, "float32"), name=f"v{i}") for i in range(2)]
    with pytest.warns(UserWarning, match="saved with 3 variables and is built with 2"):
        restored.build(variables)
    assert [restored.multiplier(v) for v in variables] == [1.0, 1.0]


# -- errors -----------------------------------------------------------------------------------


def test_an_unknown_backbone_lists_the_names_and_how_to_pass_a_keras_hub_model():
    with pytest.raises(ValueError) as info:
        models.build_embedding_model("alexnet")
    message = str(info.value)
    for part in ("resnet50", "efficientnet_b0", "dinov2_small", "clip_vit_b16",
                 "siglip_base_patch16_224", "keras_hub.models.Backbone.from_preset(",
                 "preset directory", "Received: backbone='alexnet'"):
        assert part in message
    with pytest.raises(ValueError, match="Received: backbone=<Sequential"):
        models.build_embedding_model(keras.Sequential([keras.Input((4,))]))


def test_without_keras_hub_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "keras_hub", None)
    with pytest.raises(ImportError, match="pip install keras-hub"):
        import_keras_hub()
    with pytest.raises(ImportError, match="pip install keras-hub"):
        models.build_embedding_model("dinov2_small")
