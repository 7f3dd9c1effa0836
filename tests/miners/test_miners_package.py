"""The tfdml.miners package: its public names, configs saved before the package existed,
and its layers (base < selection < families < __init__), read from the source files."""

from __future__ import annotations

import ast
import pathlib

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
ABOVE = ("losses", "models", "search", "metrics", "data", "callbacks", "export",
         "analysis", "datasets", "compat", "layers", "geometry")


def test_the_public_names_are_those_of_the_single_module():
    assert sorted(miners.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(miners, name) is not None
    # Importable before the split, and kept: the strategy names.
    assert miners.POSITIVE_STRATEGIES == ("easy", "hard", "random", "all")
    assert "distance_weighted" in miners.NEGATIVE_STRATEGIES
    assert miners.MS_POSITIVE_STRATEGIES == ("hard", "easy", "all")


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
