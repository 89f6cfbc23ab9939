"""The documentation: the site builds strictly and offline, its generated parts, and the README.

* ``mkdocs build --strict`` succeeds (broken links, missing references, a
  results file a page asks for that does not exist, docstrings the API
  reference cannot parse: each fails it), with no network, and the site
  loads nothing remote;
* every table a page asks for renders from the committed results without a
  gap; missing files, keys and tables behave as ``docs/_hooks`` promises;
* the tables made from the source (settings, exit codes) list everything
  the code defines, and the API reference every name of each ``__all__``;
* the README stays a landing page (<= 8 KB) whose snippets run as written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import mpi_env

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
HOOKS = DOCS / "_hooks"
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
BIN = Path(sys.executable).parent

sys.path.insert(0, str(HOOKS))

import api_pages  # noqa: E402
import results_tables as rt  # noqa: E402
import source_tables  # noqa: E402
import tables_ddl  # noqa: E402, F401 - registers tables
import tables_tflms  # noqa: E402, F401 - registers tables


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def _env(**extra) -> dict[str, str]:
    env = mpi_env({"NO_MKDOCS_2_WARNING": "1", **extra})
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return env


def _offline_prefix() -> list[str]:
    """``unshare -n`` (a network namespace with no network) when this process may use it."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n", "--"]
    return []


# --------------------------------------------------------------------------- the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    prefix = _offline_prefix()
    # Without a network namespace, a proxy that refuses connections stands in for "offline".
    offline = (
        {} if prefix else {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    )
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(**offline),
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "WARNING -" not in log and "ERROR -" not in log, log[-6000:]
    return out


def test_site_builds_strictly_offline_with_every_page(site):
    for page in _pages():
        html = site / page.relative_to(DOCS).with_suffix(".html")
        assert html.is_file(), f"{page} was not built"
        text = html.read_text()
        assert "{{" not in text, f"an unexpanded directive is left in {html.name}"
    for page in api_pages.PACKAGES.values():
        assert (site / page).with_suffix(".html").is_file()
    assert (site / "results" / "capacity.json").is_file()


def test_the_site_loads_nothing_from_the_network(site):
    remote = re.compile(
        r"<(?:script|img|iframe|source)\b[^>]*\bsrc=[\"']?(?:https?:)?//"
        r"|<link\b[^>]*\bhref=[\"']?(?:https?:)?//[^>]*>"
        r"|@import\s+url\([\"']?(?:https?:)?//|fonts\.googleapis"
    )
    offenders = []
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js") and remote.search(
            path.read_text(errors="replace")
        ):
            offenders.append(str(path.relative_to(site)))
    assert not offenders, offenders


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    pages = [str(p.relative_to(DOCS)) for p in _pages()] + list(api_pages.PACKAGES.values())
    for page in pages:
        assert f": {page}\n" in nav, f"{page} is not in the nav of mkdocs.yml"


def test_the_reference_documents_every_public_name(site):
    for package, page in api_pages.PACKAGES.items():
        html = (site / page).with_suffix(".html").read_text()
        for item in api_pages.public_names(package):
            assert item.public in html, f"{item.public} is missing from {page}"


# --------------------------------------------------------------------------- generated tables


def _directives(kind: str) -> list[tuple[Path, str]]:
    pattern = re.compile(r"\{\{\s*" + kind + r"\s+([^}]*?)\s*\}\}")
    return [(page, m.group(1)) for page in _pages() for m in pattern.finditer(page.read_text())]


def test_every_table_on_the_pages_renders_the_committed_results_without_gaps():
    tables = _directives("table")
    assert tables, "no page asks for a table"
    used = set()
    for page, args in tables:
        text = rt.render_table(RESULTS, args, str(page))
        used.add(shlex.split(args)[1])
        assert "could not be made" not in text, (page, args, text)
        assert '"missing"' not in text, (page, args, text)  # the note under a table with gaps
        assert "Source: [`" in text
    assert used == set(rt.TABLES), f"tables no page uses: {set(rt.TABLES) - used}"
    for page, args in _directives("value"):
        assert "missing" not in rt.render_value(RESULTS, args, str(page)), (page, args)


def test_simulated_results_say_so_and_by_which_simulator():
    for name, kind in (("capacity.json", "capacity"), ("simulator_fidelity.json", "fidelity")):
        text = rt.render_table(RESULTS, f"{name} {kind}")
        assert "**Simulated**" in text and "tflms.simulate (" in text and "grappler" in text
    demo = rt.render_table(RESULTS, "demo_summary.json demo_memory")
    assert "**Simulated**" in demo and "tflms.simulate (" in demo


def test_a_missing_results_file_or_table_stops_the_build():
    with pytest.raises(rt.DocsBuildError, match="does not exist"):
        rt.render_table(RESULTS, "no_such_results.json capacity")
    with pytest.raises(rt.DocsBuildError, match="not registered"):
        rt.render_table(RESULTS, "capacity.json no_such_table")
    with pytest.raises(rt.DocsBuildError, match="reads capacity.json"):
        rt.render_table(RESULTS, "allreduce.json capacity")
    with pytest.raises(rt.DocsBuildError, match="does not exist"):
        rt.render_value(RESULTS, "no_such_results.json a.b")
    text = rt.render_table(RESULTS, 'allreduce.json allreduce_sizes layout="9 ranks"')
    assert "No layout '9 ranks'" in text and "has no `layouts[layout=9 ranks]`" in text


def test_missing_keys_are_said_plainly_and_new_keys_are_ignored(tmp_path):
    data = json.loads((RESULTS / "capacity.json").read_text())
    full = rt.render_table(RESULTS, "capacity.json capacity")
    data["a_key_from_a_later_benchmark"] = {"x": 1}
    data["models"]["resnet50"]["recomputation"] = {"ours": 999}
    (tmp_path / "capacity.json").write_text(json.dumps(data))
    assert rt.render_table(tmp_path, "capacity.json capacity") == full

    del data["summary"]
    del data["models"]["isensee2017"]["with_lms"]["nvlink2"]
    (tmp_path / "capacity.json").write_text(json.dumps(data))
    text = rt.render_table(tmp_path, "capacity.json capacity")
    assert "missing" in text
    assert (
        "has no `summary.resnet50.ratio_ours`" in text
        and "`models.isensee2017.with_lms.nvlink2.ours`" in text
    )
    assert "python benchmarks/bench_capacity.py" in text
    assert "missing" in rt.render_value(tmp_path, "capacity.json summary.resnet50.ratio_ours .2f")


def test_a_changed_file_layout_gives_a_message_not_a_crash(tmp_path):
    (tmp_path / "tflms_rewrite.json").write_text(json.dumps({"rewrite": "not a list any more"}))
    text = rt.render_table(tmp_path, "tflms_rewrite.json rewrite_speed")
    assert "the file's layout has changed" in text or "missing" in text


def test_value_formats():
    data = json.loads((RESULTS / "capacity.json").read_text())
    plain = data["models"]["resnet50"]["without_lms"]["ours"]
    assert rt.render_value(RESULTS, "capacity.json models.resnet50.without_lms.ours") == str(plain)
    value = data["summary"]["resnet50"]["ratio_ours"]
    assert (
        rt.render_value(RESULTS, "capacity.json summary.resnet50.ratio_ours .2f") == f"{value:.2f}"
    )
    assert rt.fmt_bytes(25 * 2**30) == "25.00 GiB" and rt.fmt_bytes(512) == "512 B"
    assert rt.fmt_size(64 << 20) == "64 MiB" and rt.fmt_size(1000) == "1000 B"
    assert rt.fmt_seconds(1.8e-6) == "1.8 us" and rt.fmt_seconds(0.00242) == "2.42 ms"
    assert rt.fmt_seconds(2.5) == "2.50 s" and rt.fmt_pct(None) == "n/a"
    assert f"{rt.MISSING:.2f}" == "missing"


def test_expand_replaces_tables_and_inline_values():
    page = "ratio {{ value capacity.json summary.resnet50.ratio_is }} here\n\n{{ table tflms_rewrite.json cpu_overhead }}\n"
    out = rt.expand(page, RESULTS)
    assert "ratio batch size here" in out and "| model |" in out and "{{" not in out


# --------------------------------------------------------------------------- tables from the source


def test_the_settings_table_lists_every_ddl_variable():
    from ddl_tf import env

    rows = source_tables.env_rows()
    listed = {row[0].strip("`") for row in rows}
    assert listed == {name for name in env.__all__ if name.startswith("DDL_")}
    assert all("no docstring" not in row[4] for row in rows)
    algo = next(row for row in rows if row[0] == "`DDL_ALLREDUCE_ALGO`")
    assert algo[1] == "`--algo`" and "'auto'" in algo[3]
    fusion = next(row for row in rows if row[0] == "`DDL_FUSION_THRESHOLD`")
    assert fusion[2] == "`HOROVOD_FUSION_THRESHOLD`"


def test_the_lms_config_table_and_the_exit_codes_cover_the_code():
    import dataclasses

    from tflms.cli.commands import ExitCode
    from tflms.config import LMSConfig

    table = source_tables.render_source("lms_config_table")
    for field in dataclasses.fields(LMSConfig):
        assert f"`{field.name}`" in table
    rows = source_tables.exit_code_rows()
    assert [int(row[0]) for row in rows] == [code.value for code in ExitCode]
    assert all("not described" not in row[2] for row in rows)


def test_help_directives_print_the_real_help():
    text = source_tables.render_source("help ddlrun")
    assert text.startswith("```text\n$ ddlrun --help\nusage: ddlrun") and "--rehearse" in text
    assert "--swapout-threshold" in source_tables.render_source("help tflms rewrite")
    with pytest.raises(rt.DocsBuildError):
        source_tables.render_source("help tflms nosuchcommand")
    with pytest.raises(rt.DocsBuildError):
        source_tables.render_source("no_such_source")


def test_the_reference_names_every_public_name():
    import ddl_tf
    import ddl_tf.keras
    import tflms

    for package in (tflms, ddl_tf, ddl_tf.keras):
        names = api_pages.public_names(package.__name__)
        assert [n.public.rsplit(".", 1)[1] for n in names] == list(package.__all__)
        page = api_pages.reference_page(package.__name__)
        for item in names:
            assert f"## `{item.public}`" in page
            if item.kind != "version":
                assert f"::: {item.defined}" in page


# --------------------------------------------------------------------------- README


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(r"```" + lang + r"\n(.*?)```", text, flags=re.S)


def test_the_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.encode()) <= 8 * 1024, (
        f"README.md is {len(text.encode())} bytes; keep it <= 8 KB"
    )
    assert text.index("make demo") < text.index("## Quick start")
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), f"README links {target}, which does not exist"


def test_every_python_snippet_of_the_docs_compiles():
    for path in [README, *_pages()]:
        for i, block in enumerate(_blocks(path.read_text(), "python")):
            compile(block, f"{path.name}[python block {i}]", "exec")


def test_json_snippets_parse_and_topology_files_load():
    from ddl_tf.core.topology.topology_file import TopologySpec

    blocks = [b for page in _pages() for b in _blocks(page.read_text(), "json")]
    assert blocks
    for block in blocks:
        data = json.loads(block)
        if "levels" in data:
            assert TopologySpec.from_dict(data).levels == tuple(data["levels"])


def test_the_readme_make_and_pip_commands_exist():
    makefile = (REPO / "Makefile").read_text()
    setup = (REPO / "setup.cfg").read_text()
    text = README.read_text()
    for target in re.findall(r"`?make (\w+)", text):
        assert re.search(rf"^{target}:", makefile, flags=re.M), (
            f"make {target} is not in the Makefile"
        )
    for extras in re.findall(r"tflms-ddl\[([\w,]+)\]", text):
        for extra in extras.split(","):
            assert re.search(rf"^{extra} =", setup, flags=re.M), (
                f"extra {extra} is not in setup.cfg"
            )


@pytest.mark.slow
def test_the_readme_lms_callback_snippet_runs(tmp_path):
    (block,) = [b for b in _blocks(README.read_text(), "python") if "LMSCallback" in b]
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    swapped = re.search(r"(\d+) tensors swapped", proc.stdout)
    assert swapped and int(swapped.group(1)) > 0, proc.stdout


@pytest.mark.slow
def test_the_readme_cli_quick_start_runs(tmp_path):
    (block,) = [b for b in _blocks(README.read_text(), "bash") if "tflms rewrite" in b]
    script = block.replace("/tmp/", f"{tmp_path}/")
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "tensors swapped" in proc.stdout and "wrote " in proc.stdout
    assert "identical: losses and every variable" in proc.stdout


@pytest.mark.slow
@pytest.mark.parallel
def test_the_readme_ddl_tf_quick_start_runs_under_ddlrun(tmp_path):
    from ddl_tf.ddlrun import build_parser

    text = README.read_text()
    (script,) = [b for b in _blocks(text, "python") if b.startswith("# train.py")]
    (train,) = [t for t in _blocks(text, "bash") if "ddlrun" in t]
    (tmp_path / "train.py").write_text(script)
    commands = [line.split("#")[0].strip() for line in train.splitlines() if line.strip()]
    for command in commands:  # every line's options exist
        build_parser().parse_args(shlex.split(command)[1:])
    local = [c for c in commands if "-H" not in c.split() and "--rehearse" not in c.split()]
    assert local, "the README shows no ddlrun command for this machine"
    proc = subprocess.run(
        shlex.split(local[0]), cwd=tmp_path, capture_output=True, text=True, timeout=600, env=_env()
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "ddlrun: 2 rank(s)" in proc.stdout and "Epoch 2/2" in proc.stdout
