"""MkDocs hooks (``hooks:`` in mkdocs.yml): what the site build adds to the Markdown in ``docs/``.

* ``on_files``: the results files (``benchmarks/results/*.json`` and
  ``*.png``) become part of the site under ``results/``, so pages can show
  the plots and link the data; the API reference pages are generated from
  the packages' ``__all__`` (:mod:`api_pages`).
* ``on_page_markdown``: ``{{ table ... }}``, ``{{ value ... }}``
  (:mod:`results_tables`) and ``{{ source ... }}`` (:mod:`source_tables`)
  directives are replaced by Markdown made from the results and the source.
* ``on_page_content``: Sphinx roles left in docstrings (``:class:`X```)
  lose the role prefix, so the reference reads ``X`` rather than
  ``:class:X``.

Anything a page asks for that does not exist stops the build with a
message naming the page and the fix.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = REPO / "benchmarks" / "results"

for path in (str(HERE), str(REPO)):
    if path not in sys.path:  # the table modules, and the packages from a source checkout
        sys.path.insert(0, path)

import api_pages  # noqa: E402
import results_tables  # noqa: E402
import source_tables  # noqa: E402
import tables_ddl  # noqa: E402, F401 - registers the ddl_tf tables
import tables_tflms  # noqa: E402, F401 - registers the tflms tables

log = logging.getLogger("mkdocs.hooks.docs")

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~)?([\w.]+)(\(\))?</code>"
)


def _role(match: re.Match) -> str:
    # Sphinx: :class:`~a.b.C` shows only ``C``; :class:`a.b.C` the whole path.
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}{match.group(3) or ''}</code>"


def on_files(files: Files, config) -> Files:
    """Add the results files and the generated reference pages."""
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".json", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    seen: dict[str, str] = {}  # each object is documented once, on the first page that has it
    for package, page in api_pages.PACKAGES.items():
        try:
            content = api_pages.reference_page(package, seen)
        except results_tables.DocsBuildError as err:
            raise PluginError(str(err)) from err
        files.append(File.generated(config, page, content=content))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Expand the directives of one page."""
    where = f"docs/{page.file.src_uri}"
    try:
        markdown = source_tables.expand(markdown, where)
        return results_tables.expand(markdown, RESULTS, where)
    except results_tables.DocsBuildError as err:
        raise PluginError(str(err)) from err


def on_page_content(html: str, page, config, files) -> str:
    """Drop Sphinx role prefixes before inline code (``:class:<code>~a.X</code>`` -> ``X``)."""
    return _ROLE.sub(_role, html)
