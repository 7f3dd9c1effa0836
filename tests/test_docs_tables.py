"""The docs' lists of losses, miners and extras, checked against the code.

The table of losses and the list of the losses that run in row blocks are generated from
the code when the site is built (``tfdml._docs``, called by ``docs/hooks.py``): here, that
the generator covers every public loss and reads what the code says, and that the pages
keep the places where they go. What is still written by hand is checked against the code:

* docs/losses.md, "What cannot run in blocks": every miner that selects over the whole
  batch is named;
* README.md, "Install": every extra of pyproject.toml, as the command that installs it.
"""

from __future__ import annotations

import inspect
import pathlib
import re

import keras
import tomllib

from tfdml import _docs, losses, miners

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOSSES_MD = (ROOT / "docs" / "losses.md").read_text()
README = (ROOT / "README.md").read_text()


def _section(text, start, end):
    begin = text.index(start)
    return text[begin:text.index(end, begin + len(start))]


def _names(text):
    return set(re.findall(r"`([A-Z][A-Za-z0-9]*)[(`]", text))


def _public_losses():
    return {name for name in losses.__all__
            if inspect.isclass(getattr(losses, name))
            and issubclass(getattr(losses, name), keras.losses.Loss)}


def test_the_generated_table_has_a_row_for_every_loss():
    rows = _docs.loss_rows(losses)
    names = [row["name"] for row in rows]
    assert len(names) == len(set(names))
    # Every public loss but the bases that losses are built on.
    assert set(names) == _public_losses() - {"MetricLoss", "ClassVectorLoss"}
    table = _docs.loss_table(losses)
    for name in names:
        assert f"| [`{name}`][tfdml.losses.{name}] |" in table, name
    assert len(table.splitlines()) == len(names) + 2


def test_the_rows_say_what_the_code_says():
    rows = {row["name"]: row for row in _docs.loss_rows(losses)}
    assert rows["TripletNCALoss"]["average"] == "anchors"
    assert rows["MultiSimilarityLoss"]["average"] == "batch"
    assert rows["TrimmedLoss"]["average"] is None  # averages as the loss it wraps
    assert rows["VICRegLoss"]["average"] == ""  # no `average` argument
    assert rows["TripletNCALoss"]["block_size"] and not rows["ArcFaceLoss"]["block_size"]
    assert rows["TripletNCALoss"]["state"] == ""
    assert "learned" in rows["ArcFaceLoss"]["state"]
    assert "`beta`" in rows["MarginLoss"]["state"] and "seed" in rows["MarginLoss"]["state"]
    assert "buffers" in rows["CrossBatchMemory"]["state"]
    assert rows["TripletNCALoss"]["summary"] == inspect.cleandoc(
        losses.TripletNCALoss.__doc__).split("\n\n")[0].replace("\n", " ")
    assert "Neighbourhood" not in rows["TripletNCALoss"]["paper"]  # the first work only
    assert "Extreme triplet learning" in rows["TripletNCALoss"]["paper"]


def test_the_block_size_list_is_the_losses_that_take_it():
    takes, refuses = _docs.block_size_losses(losses)
    accepted = {name for name, cls in _docs.loss_classes(losses).items()
                if "block_size" in inspect.signature(cls.__init__).parameters}
    assert set(takes) | set(refuses) == accepted and not set(takes) & set(refuses)
    assert refuses == ["IntraPairVarianceLoss"]
    assert {"TripletNCALoss", "LoOpLoss", "DynamicSoftMarginLoss"} <= set(takes)


def test_the_pages_keep_the_generated_blocks():
    assert "\n<!-- generated: losses-table -->\n" in LOSSES_MD
    assert "\n<!-- generated: block-size-losses -->\n" in LOSSES_MD
    # The formulas are the docstrings': no hand-kept table of them.
    assert "| loss | per anchor |" not in LOSSES_MD


def test_the_miners_that_refuse_blocks_are_named():
    refusals = _section(LOSSES_MD, "- What cannot run in blocks raises a ValueError", "\n- ")
    whole_batch = set(_docs.whole_batch_miners(miners))
    assert whole_batch == {"HDCMiner", "UniformHistogramMiner"}
    assert whole_batch | {"TripletMiner"} <= _names(refusals)


def test_the_install_section_names_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    install = _section(README, "## Install", "\n## ")
    for extra in extras:
        assert f'".[{extra}]"' in install or f'".[cpu,{extra}]"' in install, extra
