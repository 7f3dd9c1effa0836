"""examples/experiments/flags.py: the scripts' command-line flags."""

from __future__ import annotations

import experiments
import pytest


def test_parser_takes_script_defaults_and_rejects_unknown_ones():
    parser = experiments.make_parser("x", dataset="cars196", learning_rate=0.01,
                                     lr_milestones=(20, 30))
    args = parser.parse_args([])
    assert (args.dataset, args.learning_rate, args.lr_milestones) == ("cars196", 0.01, [20, 30])
    args = parser.parse_args(["-P", "8", "-K", "4", "--lr", "0.1", "--smoke"])
    assert (args.classes_per_batch, args.samples_per_class, args.learning_rate) == (8, 4, 0.1)
    with pytest.raises(ValueError, match="lr_milestone"):
        experiments.make_parser("x", lr_milestone=(1,))
    with pytest.raises(SystemExit):
        parser.parse_args(["--epochs", "0"])
