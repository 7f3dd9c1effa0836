"""examples/digits_manifold.py: ManifoldLoss from random and class-mean proxies runs end to end."""

import importlib.util
import math
import pathlib

import pytest

pytestmark = pytest.mark.slow  # runs an example script

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "digits_manifold.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("digits_manifold", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_starts_give_finite_terms_and_class_means_start_in_the_data(capsys):
    results = _load_script().main(["--epochs", "1", "--steps-per-epoch", "2",
                                   "--eval-batches", "2", "--no-jit-compile"])
    out = capsys.readouterr().out
    assert list(results) == ["random", "class-means"]
    for name, run in results.items():
        for when in ("before", "after"):
            terms = run[when]
            total = terms["intrinsic"] + terms["context"]  # lambda_c = 1
            assert math.isclose(terms["loss"], total, rel_tol=1e-6), (name, when, terms)
            assert 0.0 <= terms["R@1"] <= 1.0 and 0.0 <= terms["positive"] <= 1.0
        assert len(run["epoch_losses"]) == 1 and math.isfinite(run["epoch_losses"][0])
        assert f"{name} proxies:" in out
    assert "Recall@1 of the raw pixels (cosine on the 64 values, no learning): 99.4" in out
    # Every image has a positive cosine with every class-mean proxy at the start (the
    # embeddings of the non-negative digit images share a cone), and the loss starts lower.
    assert results["class-means"]["before"]["positive"] == 1.0
    assert results["class-means"]["before"]["loss"] < results["random"]["before"]["loss"]


def test_refuses_sizes_below_one(capsys):
    for flag in ("--epochs", "--eval-batches"):
        with pytest.raises(SystemExit) as info:
            _load_script().main([flag, "0"])
        assert info.value.code == 2 and flag in capsys.readouterr().err
