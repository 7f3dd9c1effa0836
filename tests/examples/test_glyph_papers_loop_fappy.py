"""The glyph comparisons of the LoOp and FAPPY papers (examples/{loop,fappy}/glyphs.py):
their flags, their losses, and a --smoke run of each with the structure of its results."""

import importlib.util
import json
import math
import pathlib

import pytest

pytestmark = pytest.mark.slow  # runs an example script

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = {"loop": ROOT / "examples" / "loop" / "glyphs.py",
           "fappy": ROOT / "examples" / "fappy" / "glyphs.py"}


def _load(paper):
    spec = importlib.util.spec_from_file_location(f"{paper}_glyphs", SCRIPTS[paper])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def script(request):
    return request.param, _load(request.param)


@pytest.mark.parametrize("flags, names", [
    (["--seeds", "-1"], "--seeds"),
    (["--seeds", "zero"], "--seeds"),
    (["--seeds", "0", "0"], "--seeds"),
    (["--steps", "0"], "--steps"),
    (["--steps", "150"], "--steps"),
    (["--configs", "no-such-loss"], "--configs"),
    (["--output", "/no/such/folder/results.json"], "--output"),
])
def test_bad_flags_are_refused_before_any_work(script, flags, names, capsys):
    _, module = script
    with pytest.raises(SystemExit) as info:
        module.main(flags)
    assert info.value.code == 2
    assert names in capsys.readouterr().err


def test_loop_configurations_pair_each_loss_with_its_loop_form():
    import tfdml

    module = _load("loop")
    for key, (name, make_loss, base) in module.CONFIGS.items():
        loss = make_loss(0)
        if key.startswith("loop-"):
            assert isinstance(loss, tfdml.losses.LoOpLoss), key
            assert base == key.removeprefix("loop-") and name.startswith("LoOp ("), key
            expected = {"triplet": "triplet", "hphn": "hphn_triplet", "ms": "multi_similarity",
                        "lifted": "lifted_structure"}[base]
            assert loss.base == expected
        else:
            assert base is None and not isinstance(loss, tfdml.losses.LoOpLoss), key
    assert module.CONFIGS["loop-ms"][1](0).epsilon == -0.02
    # The default set holds each base with its LoOp form, the base first.
    defaults = list(module.DEFAULT_CONFIGS)
    for key in defaults:
        base = module.CONFIGS[key][2]
        assert base is None or defaults.index(base) < defaults.index(key)
        assert base is not None or f"loop-{key}" in defaults


def test_fappy_configurations_are_the_papers_bin_widths():
    import tfdml

    module = _load("fappy")
    assert isinstance(module.CONFIGS["histogram"][1](0), tfdml.losses.HistogramLoss)
    assert module.CONFIGS["histogram"][1](0).bin_width == 0.01
    widths = [module.CONFIGS[f"fappy-{w}"][1](0).min_bin_width for w in ("0.01", "0.001", "0.0001")]
    assert widths == [0.01, 0.001, 0.0001]
    assert all(module.CONFIGS[k][2] == "histogram" for k in module.CONFIGS if k != "histogram")


def _in_unit_interval(value):
    return math.isfinite(value) and 0.0 <= value <= 1.0


@pytest.mark.slow
def test_smoke_run_writes_finite_numbers_next_to_their_baselines(script, tmp_path, capsys):
    paper, module = script
    output = tmp_path / "results.json"
    results = module.main(["--smoke", "--seeds", "0", "1", "--output", str(output)])
    out = capsys.readouterr().out

    assert json.loads(output.read_text()) == json.loads(json.dumps(results))
    assert results["smoke"] is True and results["complete"] is True
    assert results["seeds"] == [0, 1] and results["recipe"]["steps"] == module.comparison.SMOKE["steps"]
    assert results["test_classes"] == 20 and results["machine"]
    assert all(_in_unit_interval(v) for v in results["raw_pixels"].values())
    configs = results["configurations"]
    assert [c["key"] for c in configs] == list(module.DEFAULT_CONFIGS)
    for config in configs:
        assert [run["seed"] for run in config["runs"]] == [0, 1], config["key"]
        for run in config["runs"]:
            for key in ("untrained", "trained"):
                assert set(run[key]) == {"recall@1", "map@r"}
                assert all(_in_unit_interval(v) for v in run[key].values()), (config, run)
            assert math.isfinite(run["final_loss"]) and run["seconds"] > 0
        for key in ("untrained", "trained"):
            for metric in ("recall@1", "map@r"):
                mean, std = config[key][metric]
                assert _in_unit_interval(mean) and math.isfinite(std) and std >= 0
        # The untrained network depends on the seed only, not on the loss.
        assert config["untrained"] == results["untrained"], config["key"]
        assert config["name"] in out
        if module.CONFIGS[config["key"]][2] is not None:
            versus = config["versus"]
            assert versus["seeds"] == 2 and 0 <= versus["recall@1 seeds better"] <= 2
            assert all(math.isfinite(v) for v in versus["recall@1"] + versus["map@r"])
    assert "| raw pixels |" in out and "| untrained CNN |" in out
    assert ("LoOp (Triplet) - Triplet" in out) if paper == "loop" else ("FAPPY 0.01 - Histogram"
                                                                         in out)
