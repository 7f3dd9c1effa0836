"""The glyph comparisons of two papers: extreme triplet learning
(`examples/extreme_triplet/glyphs.py`) and easy positive sampling against class collapse
(`examples/class_collapse/glyphs.py`): flags, helpers, and a `--smoke` run of each."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # runs an example script

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = {"extreme_triplet": ROOT / "examples" / "extreme_triplet" / "glyphs.py",
           "class_collapse": ROOT / "examples" / "class_collapse" / "glyphs.py"}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_glyphs", SCRIPTS[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def extreme():
    return _load("extreme_triplet")


@pytest.fixture(scope="module")
def collapse():
    return _load("class_collapse")


def _is_score(value):
    return isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0


# -- flags -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps"),
    (["--steps", "150"], "--steps"),
    (["--steps", "-100"], "--steps"),
    (["--seeds", "-1"], "seed must be >= 0"),
    (["--seeds", "one"], "seed must be an integer"),
    (["--seeds", "0", "0"], "--seeds must not repeat"),
    (["--configs", "nothing"], "invalid choice"),
])
def test_bad_flags_are_refused_by_name(name, flags, message, capsys, tmp_path):
    module = _load(name)
    with pytest.raises(SystemExit) as info:
        module.main([*flags, "--output", str(tmp_path / "out.json")])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_defaults_are_the_recipe_and_smoke_is_small(name):
    module = _load(name)
    args = module.parse_args([])
    assert args.seeds == [0, 1, 2] and args.steps == 1000
    assert args.configs == list(module.CONFIGS)
    assert pathlib.Path(args.output) == SCRIPTS[name].parent / "results_glyphs.json"
    smoke = module.parse_args(["--smoke"])
    assert smoke.seeds == [0] and smoke.steps < 100
    assert pathlib.Path(smoke.output).parent != SCRIPTS[name].parent  # never the real results
    assert module.parse_args(["--steps", "200", "--seeds", "2"]).steps == 200


# -- helpers -----------------------------------------------------------------------------------


def test_extreme_configs_are_the_papers_minings_and_orders(extreme):
    assert extreme.CONFIGS == {
        "EPHN-1st": (1, "easy", "hard"), "EPHN-2nd": (2, "easy", "hard"),
        "EPSHN-1st": (1, "easy", "semihard"), "EPSHN-2nd": (2, "easy", "semihard"),
        "HPHN-1st": (1, "hard", "hard"), "HPHN-2nd": (2, "hard", "hard")}
    loss = extreme.make_loss(2, "easy", "semihard", seed=0)()
    assert loss.get_config()["order"] == 2
    assert (loss.miner.positive, loss.miner.negative) == ("easy", "semihard")


def test_mean_cosine_against_every_pair(extreme):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 5)) * rng.uniform(0.1, 4.0, size=(7, 1)) + 0.5
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    pairs = [z[i] @ z[j] for i in range(7) for j in range(7) if i != j]
    assert math.isclose(extreme.glyph_recipe.mean_cosine(x), float(np.mean(pairs)), rel_tol=1e-12)
    assert math.isclose(extreme.glyph_recipe.mean_cosine(np.tile(x[:1], (4, 1))), 1.0, rel_tol=1e-12)


def test_alphabet_labels_keep_the_images_and_name_the_alphabets(collapse):
    import tfdml

    train = tfdml.datasets.load("glyphs", "train", num_classes=60, samples_per_class=2,
                                characters_per_alphabet=10)
    coarse = collapse.by_alphabet(train)
    assert coarse.images is train.images and len(coarse) == len(train)
    np.testing.assert_array_equal(coarse.labels, train.labels // 10)
    assert coarse.num_classes == 4 and coarse.categories is None
    assert set(coarse.class_names) == {0, 1, 2, 3}


def test_collapse_losses_use_the_positive_strategy(collapse):
    triplet = collapse.make_loss("triplet", "easy", seed=1)(30, 64)
    margin = collapse.make_loss("margin", "random", seed=1)(30, 64)
    assert (triplet.miner.positive, triplet.miner.negative) == ("easy", "semihard")
    assert (margin.miner.positive, margin.miner.negative) == ("random", "distance_weighted")
    assert margin.get_config()["num_classes"] == 30


# -- smoke runs ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_extreme_triplet_smoke(extreme, tmp_path, capsys):
    out = tmp_path / "results.json"
    results = extreme.main(["--smoke", "--output", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["complete"] and results["smoke"] and results["seeds"] == [0]
    assert set(results["configs"]) == set(extreme.CONFIGS)
    raw = results["baselines"]["raw_pixels"]
    assert _is_score(raw["recall@1"]) and _is_score(raw["map@r"])
    untrained = results["baselines"]["untrained"]
    assert set(untrained["per_seed"]) == {"0"}
    for name, config in results["configs"].items():
        (run,) = config["runs"]
        assert run["steps"] == extreme.SMOKE_STEPS
        for key in ("trained", "untrained"):
            assert all(_is_score(run[key][m]) for m in ("recall@1", "map@r")), (name, run)
        # Every configuration starts from the seed's same untrained network.
        assert run["untrained"] == {k: untrained["per_seed"]["0"][k] for k in run["untrained"]}
        assert -1.0 <= run["mean_cosine"] <= 1.0
        assert tuple(config["summary"]["recall@1"]) == (run["trained"]["recall@1"], 0.0)
        assert f"| {name} |" in printed
    assert "| raw pixels |" in printed and "| untrained network |" in printed


@pytest.mark.slow
def test_class_collapse_smoke(collapse, tmp_path, capsys):
    out = tmp_path / "results.json"
    results = collapse.main(["--smoke", "--seeds", "1", "--output", str(out)])
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["complete"] and results["smoke"] and results["seeds"] == [1]
    assert set(results["configs"]) == set(collapse.CONFIGS)
    sets = {f"{split} {kind}" for split, kind in collapse.SETS}
    raw = results["baselines"]["raw_pixels"]
    assert set(raw) == sets
    assert all(_is_score(v[m]) for v in raw.values() for m in ("recall@1", "map@r"))
    untrained = results["baselines"]["untrained"]["per_seed"]["1"]
    for name, config in results["configs"].items():
        (run,) = config["runs"]
        assert set(run["sets"]) == set(run["untrained_sets"]) == sets
        for values in (*run["sets"].values(), *run["untrained_sets"].values()):
            assert all(_is_score(values[m]) for m in ("recall@1", "map@r")), (name, run)
        # The recipe's numbers are the test characters' (same network, same split).
        assert run["trained"] == run["sets"]["test character"]
        assert run["untrained"] == untrained["test character"]
        assert -1.0 <= run["mean_cosine"] <= 1.0
        batch = collapse.SMOKE_BATCH[config["labels"]]
        assert (run["classes_per_batch"], run["samples_per_class"]) == (
            batch["classes_per_batch"], batch["samples_per_class"])
        assert f"| {config['title']} |" in printed
    assert printed.count("| raw pixels |") == 2 and printed.count("| untrained network |") == 2
