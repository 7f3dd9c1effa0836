"""examples/large_batch_digits.py: a blocked loss and a chunked network train on a large batch."""

import importlib.util
import math
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "large_batch_digits.py"

pytestmark = [pytest.mark.multibackend, pytest.mark.slow]  # runs an example script


def _load_script():
    spec = importlib.util.spec_from_file_location("large_batch_digits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trains_in_blocks_and_chunks_and_reports_memory(capsys):
    module = _load_script()
    result = module.main(["--batch-size", "600", "--block-size", "128", "--chunk-size", "256",
                          "--copies", "2", "--epochs", "2"])
    out = capsys.readouterr().out
    assert result["batch"] == 600
    assert len(result["losses"]) == 2 and all(math.isfinite(v) for v in result["losses"])
    assert result["losses"][-1] < result["losses"][0]  # it learns
    for row in (result["raw"], result["before"], result["after"]):
        assert 0.0 <= row[1] <= row[2] <= row[4] <= row[8] <= 1.0
    assert "Memory: peak RSS" in out and "[600, 600] float32 matrix is 1 MiB" in out
    assert "| raw pixels |" in out and "| after training |" in out


def test_rejects_sizes_below_one():
    module = _load_script()
    with pytest.raises(SystemExit):
        module.main(["--block-size", "0"])


def test_rejects_a_batch_larger_than_the_training_set(capsys):
    # It used to be cut to the training set's size without a word.
    with pytest.raises(SystemExit) as info:
        _load_script().main(["--batch-size", "5000", "--copies", "2"])
    assert info.value.code == 2 and "--batch-size 5000" in capsys.readouterr().err
