"""The README's demo: held-out Recall@1 must rise after training."""

import importlib.util
import pathlib

DEMO = pathlib.Path(__file__).resolve().parents[1] / "examples" / "digits_demo.py"


def _load_demo():
    spec = importlib.util.spec_from_file_location("digits_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_recall_rises_on_held_out_digits(capsys):
    before, after = _load_demo().main([])
    out = capsys.readouterr().out
    assert set(before) == set(after) == {1, 2, 4, 8}
    assert after[1] > before[1], (before, after)
    assert "Recall@K on the held-out digits 6-9" in out


def test_demo_pk_batches_hold_k_samples_of_p_distinct_classes():
    import numpy as np

    demo = _load_demo()
    labels = np.repeat(np.arange(6), [3, 10, 10, 10, 10, 10])
    batches = demo.pk_batches(labels, classes_per_batch=4, samples_per_class=5, seed=1)
    for _ in range(20):
        idx = next(batches)
        classes, counts = np.unique(labels[idx], return_counts=True)
        assert len(idx) == 20 and len(classes) == 4 and set(counts) == {5}
