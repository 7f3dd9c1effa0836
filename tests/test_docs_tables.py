"""The docs' lists of losses, miners and extras, checked against the code: a loss added to
the library without its row, or a row left for something that changed, fails here.

* docs/losses.md, "The losses": a row for every public loss class of ``tfdml.losses``, and
  no row for a class it does not have;
* docs/losses.md, "The loss in row blocks": exactly the loss classes whose constructor takes
  ``block_size`` (the one that refuses it named as such), and every miner that selects over
  the whole batch named where the refusals are;
* README.md, "Install": every extra of pyproject.toml, as the command that installs it.
"""

from __future__ import annotations

import inspect
import pathlib
import re

import keras
import tomllib

from tfdml import losses, miners

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOSSES_MD = (ROOT / "docs" / "losses.md").read_text()
README = (ROOT / "README.md").read_text()
ABSTRACT = {"MetricLoss", "ClassWeightLoss"}


def _loss_classes():
    found = {}
    for name in losses.__all__:
        obj = getattr(losses, name)
        if inspect.isclass(obj) and issubclass(obj, keras.losses.Loss) and name not in ABSTRACT:
            found[name] = obj
    return found


def _section(text, start, end):
    begin = text.index(start)
    return text[begin:text.index(end, begin + len(start))]


def _names(text):
    return set(re.findall(r"`([A-Z][A-Za-z0-9]*)[(`]", text))


def test_the_losses_table_has_a_row_for_every_loss():
    after = LOSSES_MD[LOSSES_MD.index("## The losses"):]
    table = after[after.index("\n| "):]
    rows = [line for line in table[:table.index("\n\n")].splitlines()
            if line.startswith("| `")]
    listed = {re.match(r"\| `([A-Za-z0-9]+)", row).group(1) for row in rows}
    assert set(_loss_classes()) - listed == set()
    assert listed - set(_loss_classes()) == set()


def test_the_block_size_list_is_the_losses_that_take_it():
    paragraph = _section(LOSSES_MD, "**The loss in row blocks: `block_size=`.**", "\n\n")
    # CrossBatchMemory and TrimmedLoss take it through the loss they wrap.
    listed = {name for name in _names(paragraph) if name.endswith("Loss")} - {
        "MetricLoss", "TrimmedLoss"}
    takes = {name for name, cls in _loss_classes().items()
             if "block_size" in inspect.signature(cls.__init__).parameters}
    assert listed == takes
    assert "not `IntraPairVarianceLoss`" in paragraph


def test_the_miners_that_refuse_blocks_are_named():
    refusals = _section(LOSSES_MD, "- What cannot run in blocks raises a ValueError", "\n- ")
    whole_batch = {name for name in dir(miners)
                   if inspect.isclass(getattr(miners, name))
                   and issubclass(getattr(miners, name), miners.Miner)
                   and getattr(miners, name).blockwise is False}
    assert whole_batch == {"HDCMiner", "UniformHistogramMiner"}
    assert whole_batch | {"TripletMiner"} <= _names(refusals)


def test_the_install_section_names_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    install = _section(README, "## Install", "\n## ")
    for extra in extras:
        assert f'".[{extra}]"' in install or f'".[cpu,{extra}]"' in install, extra
