"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

* Before the build: every public name of tfdml (the ``__all__`` of each public package)
  must be on an API page (``docs/api/``, a ``::: tfdml.<package>.<name>`` line) and have a
  docstring, or the build fails.
* In the pages: ``<!-- generated: NAME -->`` lines become the tables and lists that
  :mod:`tfdml._docs` reads from the code (the table of losses, the losses that run in
  blocks, the miners that cannot).
* Links out of docs/ to the repository's files (``../benchmarks/README.md``): the file
  must exist, or the build fails; in the site an image is copied under ``repo/`` and
  shown, any other link becomes the file's path (the site has no copy of the
  repository).
* In the HTML: the Sphinx roles of the docstrings (``:class:`X```) keep only their code
  span.
"""

from __future__ import annotations

import os
import pathlib
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File  # noqa: E402

import tfdml  # noqa: E402
from tfdml import _docs  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
API = DOCS / "api"
#: A Markdown link or image to a file of the repository outside docs/ (one level up).
_OUTSIDE = re.compile(r"(!?)\[([^\]]*)\]\(\.\./([^)\s#]+)(#[^)\s]*)?\)")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):(<code>)~?")
_GENERATED = re.compile(r"^<!-- generated: ([a-z_-]+) -->$", re.M)


def _names(names):
    return ", ".join(f"`{name}`" for name in names)


def _generated(name):
    if name == "losses-table":
        return _docs.loss_table(tfdml.losses)
    if name == "block-size-losses":
        takes, refuses = _docs.block_size_losses(tfdml.losses)
        text = f"The losses that take `block_size`: {_names(takes)}."
        if refuses:
            takes_, raises = ("takes", "raises") if len(refuses) == 1 else ("take", "raise")
            text += (f" {_names(refuses)} {takes_} the argument but {raises} a ValueError for "
                     "any value but `None`: the terms couple the whole batch.")
        return text
    if name == "whole-batch-miners":
        return _names(_docs.whole_batch_miners(tfdml.miners))
    raise PluginError(f"unknown generated block {name!r}")


def on_pre_build(config, **kwargs):
    pages = "\n".join(path.read_text() for path in sorted(API.glob("*.md")))
    absent, undocumented = _docs.missing_from_api(tfdml, pages)
    problems = []
    if absent:
        problems.append("public names on no API page (docs/api/*.md): " + ", ".join(absent))
    if undocumented:
        problems.append("public names without a docstring: " + ", ".join(undocumented))
    if problems:
        raise PluginError("; ".join(problems))


def on_files(files, config, **kwargs):
    for path in sorted(DOCS.glob("*.md")):
        for match in _OUTSIDE.finditer(path.read_text()):
            target = ROOT / match.group(3)
            if match.group(1) and target.is_file() and not files.get_file_from_path(
                    f"repo/{match.group(3)}"):
                files.append(File.generated(config, f"repo/{match.group(3)}",
                                            abs_src_path=str(target)))
    return files


def _outside(match, page):
    image, text, path, anchor = match.groups()
    if not (ROOT / path).exists():
        raise PluginError(f"{page.file.src_uri}: the link to ../{path} names no file")
    if image:
        return f"![{text}](repo/{path})"
    return f"{text} (`{path}`)" if text.strip("`") != path else f"`{path}`"


def on_page_markdown(markdown, page, config, files, **kwargs):
    markdown = _GENERATED.sub(lambda match: _generated(match.group(1)), markdown)
    return _OUTSIDE.sub(lambda match: _outside(match, page), markdown)


def on_page_content(html, page, config, files, **kwargs):
    return _ROLE.sub(r"\1", html)
