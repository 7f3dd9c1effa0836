"""The tfdml.miners package: its public names, configs saved before the package existed,
and its layers (base < selection < families < __init__), read from the source files."""

from __future__ import annotations

import ast
import pathlib

import keras
import pytest

from tfdml import miners

PACKAGE = pathlib.Path(miners.__file__).resolve().parent

PUBLIC = [
    "AllPairsMiner", "AngularMiner", "BatchEasyHardMiner", "EmbeddingsAlreadyPackagedAsTriplets",
    "HDCMiner", "Miner", "MultiSimilarityMiner", "PairMarginMiner", "Pairs",
    "TripletMarginMiner", "TripletMiner", "Triplets", "UniformHistogramMiner", "as_pairs",
    "as_triplets", "distance_log_weights", "gather_triplet_scores", "negatives_at_or_below",
]

#: What each module of the package may import from the package.
LAYERS = {
    "base": set(),
    "selection": {"base"},
    "triplet": {"base", "selection"},
    "pairs": {"base", "selection"},
    "distance": {"base", "selection"},
    "histogram": {"base", "selection"},
    "__init__": {"base", "selection", "triplet", "pairs", "distance", "histogram"},
}

#: tfdml modules above the miners, which the miners never import.
ABOVE = ("losses", "models", "metric_model", "search", "metrics", "data", "callbacks", "export",
         "analysis", "datasets", "experiments", "compat", "layers", "geometry")

# Configs as Keras serialized them when the miners lived in tfdml/miners.py and
# tfdml/distance_miners.py.
OLD_CONFIGS = [
    ("tfdml.miners", "TripletMiner", {"positive": "easy", "negative": "distance_weighted",
                                      "disjoint": False, "seed": 3, "lower_cutoff": 0.5,
                                      "upper_cutoff": 1.4}),
    ("tfdml.miners", "MultiSimilarityMiner", {"epsilon": 0.05, "positive": "easy"}),
    ("tfdml.miners", "AllPairsMiner", {}),
    ("tfdml.miners", "EmbeddingsAlreadyPackagedAsTriplets", {}),
    ("tfdml.distance_miners", "PairMarginMiner", {"pos_margin": 0.1, "neg_margin": 0.7,
                                                  "distance": "cosine"}),
    ("tfdml.distance_miners", "TripletMarginMiner", {"margin": 0.3, "type_of_triplets": "hard",
                                                     "distance": "l2"}),
    ("tfdml.distance_miners", "BatchEasyHardMiner", {"pos_strategy": "hard",
                                                     "neg_strategy": "semihard",
                                                     "allowed_pos_range": None,
                                                     "allowed_neg_range": [0.1, 1.5],
                                                     "distance": "l2"}),
    ("tfdml.distance_miners", "HDCMiner", {"filter_percentage": 0.3, "distance": "l2"}),
    ("tfdml.distance_miners", "AngularMiner", {"angle": 0.4}),
    ("tfdml.distance_miners", "UniformHistogramMiner", {"num_bins": 20, "pos_per_bin": 3,
                                                        "neg_per_bin": 4, "distance": "l2",
                                                        "seed": 1}),
]


def test_the_public_names_are_those_of_the_single_module():
    assert sorted(miners.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(miners, name) is not None
    # Importable before the split, and kept: the strategy names.
    assert miners.POSITIVE_STRATEGIES == ("easy", "hard", "random", "all")
    assert "distance_weighted" in miners.NEGATIVE_STRATEGIES
    assert miners.MS_POSITIVE_STRATEGIES == ("hard", "easy", "all")


@pytest.mark.parametrize("module, class_name, config", OLD_CONFIGS,
                         ids=[c[1] for c in OLD_CONFIGS])
def test_configs_saved_before_the_package_still_load(module, class_name, config):
    saved = {"module": module, "class_name": class_name, "config": config,
             "registered_name": f"tfdml>{class_name}"}
    miner = keras.saving.deserialize_keras_object(saved)
    assert type(miner) is getattr(miners, class_name)
    again = keras.saving.serialize_keras_object(miner)
    assert again["registered_name"] == f"tfdml>{class_name}"
    restored = keras.saving.deserialize_keras_object(again)
    assert restored.get_config() == miner.get_config()


def test_a_loss_config_saved_before_the_package_still_loads():
    import tfdml

    loss = tfdml.losses.ContrastiveLoss(miner=miners.HDCMiner(0.3))
    config = loss.get_config()
    config["miner"]["module"] = "tfdml.distance_miners"  # as saved before
    restored = tfdml.losses.ContrastiveLoss.from_config(config)
    assert isinstance(restored.miner, miners.HDCMiner)
    assert restored.miner.filter_percentage == 0.3


def _imports(path):
    """``(module, names)`` of every ``from tfdml... import ...`` of a source file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdml"):
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tfdml"):
                    yield alias.name, []


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_module_imports_only_the_layers_below_it(name):
    path = PACKAGE / f"{name}.py"
    for module, names in _imports(path):
        parts = module.split(".")
        assert len(parts) < 2 or parts[1] not in ABOVE, (name, module)
        if parts[:2] == ["tfdml", "miners"]:
            assert len(parts) == 3 and parts[2] in LAYERS[name], (name, module)
            private = [n for n in names if n.startswith("_")]
            assert not private, (name, module, private)


def test_every_module_of_the_package_is_in_a_layer():
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(LAYERS)
