"""Outside check: Horovod's own ``test/parallel`` TensorFlow test files against ddl_tf.

Horovod's tests are not part of this repository (they are Horovod's); get
Horovod 0.28.1's ``test/parallel/test_tensorflow.py``,
``test/parallel/base_test_tensorflow.py`` and ``test/utils/common.py`` into a
folder (keeping that layout), then::

    python tests/parallel/horovod_outside_check.py file  HOROVOD_TEST_DIR out.json
    python tests/parallel/horovod_outside_check.py each  HOROVOD_TEST_DIR out.json

``file`` runs the whole file in one ``mpirun -np 2``; ``each`` runs one
``mpirun`` per test. ``--ddl PATH`` tests a copy of ddl_tf at PATH (e.g. an
older commit from ``git archive``) instead of the installed one. ``--test-file``
picks another file of ``parallel/`` (``test_tensorflow_process_sets.py``,
``test_tensorflow_process_sets_dynamic.py``, ``test_adasum_tensorflow.py``;
each holds one test class) and ``--np`` the number of ranks (2 by default).

The script writes a shim package into a temporary folder: ``horovod.tensorflow``
is ``from ddl_tf import *`` (``horovod.tensorflow.keras`` likewise from
``ddl_tf.keras``); the only names it adds are the Horovod internals the test
files import (``horovod.tensorflow.util._executing_eagerly``, re-exported as
``hvd._executing_eagerly`` as Horovod does, and
``horovod.runner.util.threads.in_thread``, ``horovod.runner.common.util.env.get_env_rank_and_size``
and ``horovod.tensorflow.mpi_ops._basics._get_process_set_ids_and_ranks``, the last
answered from ``ddl_tf.core.process_sets.registered``), plus stand-ins for the ``mock``
and ``cloudpickle`` packages that ``common.py`` imports and these tests never use.

Horovod's file runs every test twice, in graph mode and in eager mode
(``run_all_in_graph_and_eager_modes``), each a subtest. A test counts as
*passed* when it passed on both ranks (at least one mode ran, none failed),
*skipped* when every mode skipped on both (no GPU), else *failed*. Each rank
runs pytest with ``--timeout`` (900 s by default), so a hang is a failure,
not a stuck job.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHIM = {
    "horovod/__init__.py": '"""Outside-check shim: the horovod package name mapped onto ddl_tf."""\n',
    "horovod/tensorflow/__init__.py": (
        "from ddl_tf import *  # noqa: F401,F403\n"
        "import ddl_tf as _ddl\n"
        "for _name in _ddl.__all__:\n"
        "    globals()[_name] = getattr(_ddl, _name)\n"
        "from horovod.tensorflow import util  # noqa: E402  Horovod internal module\n"
        "from horovod.tensorflow.util import _executing_eagerly  # noqa: E402,F401\n"
        "from horovod.tensorflow import mpi_ops  # noqa: E402  Horovod internal module\n"
    ),
    "horovod/tensorflow/mpi_ops.py": (
        "from ddl_tf.core import process_sets as _sets\n\n\n"
        "class _Basics:\n"
        "    @staticmethod\n"
        "    def _get_process_set_ids_and_ranks():\n"
        "        return _sets.registered()\n\n\n"
        "_basics = _Basics()\n"
    ),
    "horovod/tensorflow/util.py": (
        "import tensorflow as tf\n\n\n"
        "def _executing_eagerly():\n"
        "    return tf.executing_eagerly()\n"
    ),
    "horovod/tensorflow/keras/__init__.py": (
        "from ddl_tf.keras import *  # noqa: F401,F403\n"
        "import ddl_tf.keras as _k\n"
        "for _name in _k.__all__:\n"
        "    globals()[_name] = getattr(_k, _name)\n"
    ),
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    "horovod/runner/common/__init__.py": "",
    "horovod/runner/common/util/__init__.py": "",
    "horovod/runner/common/util/env.py": (
        "import os\n\n\n"
        "def get_env_rank_and_size():\n"
        "    for r, s in (('HOROVOD_RANK', 'HOROVOD_SIZE'), ('OMPI_COMM_WORLD_RANK',\n"
        "                 'OMPI_COMM_WORLD_SIZE'), ('PMI_RANK', 'PMI_SIZE')):\n"
        "        if os.environ.get(r) is not None and os.environ.get(s) is not None:\n"
        "            return int(os.environ[r]), int(os.environ[s])\n"
        "    return 0, 1\n"
    ),
    "horovod/runner/util/threads.py": (
        "import threading\n\n\n"
        "def in_thread(target, args=(), name=None, daemon=True, silent=False):\n"
        "    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)\n"
        "    thread.start()\n"
        "    return thread\n"
    ),
    "mock.py": "from unittest.mock import *  # noqa: F401,F403\n",
    "cloudpickle.py": "from pickle import dumps, loads  # noqa: F401\n",
    "outcome_log.py": (
        "import json, os\n\n\n"
        "def pytest_runtest_logreport(report):\n"
        "    path = os.environ.get('OUTCOME_LOG')\n"
        "    if not path or (report.when != 'call' and report.outcome == 'passed'):\n"
        "        return\n"
        "    context = getattr(report, 'context', None)\n"
        "    message = ''\n"
        "    if report.failed:\n"
        "        message = str(report.longreprtext)[-600:]\n"
        "    elif report.skipped and isinstance(report.longrepr, tuple):\n"
        "        message = str(report.longrepr[2])[:200]\n"
        "    entry = {'nodeid': report.nodeid, 'outcome': report.outcome, 'message': message,\n"
        "             'subtest': None if context is None else str(getattr(context, 'msg', context))}\n"
        "    with open(path, 'a') as f:\n"
        "        f.write(json.dumps(entry) + '\\n')\n"
    ),
}

RANK_MAIN = """
import os, sys, pytest
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
out = sys.argv[1]
os.environ["OUTCOME_LOG"] = f"{out}/rank{rank}.jsonl"
sys.exit(pytest.main(["-p", "no:cacheprovider", "-p", "outcome_log", "-q", "-rN",
                      "--timeout", sys.argv[2], *sys.argv[3:]]))
"""


def write_shim(folder: Path) -> None:
    for relative, text in SHIM.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_names(test_file: Path) -> tuple[str, list[str]]:
    """The file's test class (the one whose name ends in ``Tests``) and its test names."""
    for node in ast.parse(test_file.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Tests"):
            return node.name, [
                n.name
                for n in node.body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
            ]
    raise SystemExit(f"no *Tests class in {test_file}")


def run_job(
    selection,
    outdir: Path,
    shim: Path,
    ddl: str | None,
    per_test: float,
    limit: float,
    np_: int = 2,
):
    """One ``mpirun -np np_`` of pytest over ``selection``; returns (seconds, killed)."""
    from ddl_tf.launch.command import find_mpirun

    outdir.mkdir(parents=True, exist_ok=True)
    for stale in outdir.glob("rank*.jsonl"):  # outcomes are appended: start from none
        stale.unlink()
    (outdir / "rank_main.py").write_text(RANK_MAIN)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(shim), *([ddl] if ddl else []), env.get("PYTHONPATH", "")]
    )
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [find_mpirun(), "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable]
    cmd += [str(outdir / "rank_main.py"), str(outdir), str(int(per_test)), *selection]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=Path(selection[0].split("::")[0]).parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=limit)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        killed = True
    (outdir / "output.txt").write_text(output)
    return time.monotonic() - start, killed


def verdicts(outdir: Path, names: list[str], missing: str, np_: int = 2) -> dict[str, dict]:
    """Per test: passed/failed/skipped over all ranks, with each rank's outcome and message."""
    per_rank = []
    for rank in range(np_):
        seen: dict[str, list[dict]] = {}
        path = outdir / f"rank{rank}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            entry = json.loads(line)
            seen.setdefault(entry["nodeid"].rpartition("::")[2], []).append(entry)
        outcomes = {}
        for name, entries in seen.items():
            failed = [e for e in entries if e["outcome"] == "failed"]
            subs = [e for e in entries if e["subtest"] is not None] or entries
            if failed:
                outcomes[name] = ("failed", failed[0]["message"])
            elif all(e["outcome"] == "skipped" for e in subs):
                outcomes[name] = ("skipped", subs[0]["message"])
            else:
                outcomes[name] = ("passed", "")
        per_rank.append(outcomes)
    table = {}
    for name in names:
        outs = [r.get(name, ("failed", missing)) for r in per_rank]
        kinds = {kind for kind, _ in outs}
        verdict = (
            "passed" if kinds == {"passed"} else "skipped" if kinds == {"skipped"} else "failed"
        )
        table[name] = {"verdict": verdict, "ranks": [list(o) for o in outs]}
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["file", "each"])
    parser.add_argument("horovod_test_dir", type=Path, help="folder holding parallel/ and utils/")
    parser.add_argument("out", type=Path, help="JSON summary to write")
    parser.add_argument("--ddl", default=None, help="test the ddl_tf package found in this folder")
    parser.add_argument("--only", default="", help="comma-separated test names")
    parser.add_argument("--per-test-timeout", type=float, default=900.0)
    parser.add_argument("--test-file", default="test_tensorflow.py", help="a file of parallel/")
    parser.add_argument("--np", type=int, default=2, help="ranks per job")
    args = parser.parse_args(argv)
    test_file = args.horovod_test_dir / "parallel" / args.test_file
    klass, names = test_names(test_file)
    if args.only:
        names = [n for n in names if n in set(args.only.split(","))]
    work = args.out.with_suffix("")
    shim = Path(tempfile.mkdtemp(prefix="horovod-shim-"))
    write_shim(shim)
    result: dict = {
        "mode": args.mode,
        "file": args.test_file,
        "np": args.np,
        "ddl": args.ddl or "installed",
        "tests": {},
    }
    try:
        if args.mode == "file":
            selection = (
                [f"{test_file}::{klass}::{n}" for n in names] if args.only else [str(test_file)]
            )
            seconds, killed = run_job(
                selection, work, shim, args.ddl, args.per_test_timeout, 6 * 3600, args.np
            )
            result.update(seconds=round(seconds, 1), killed=killed)
            missing = "job killed" if killed else "not reported"
            result["tests"] = verdicts(work, names, missing, args.np)
        else:
            start = time.monotonic()
            for name in names:
                selection = [f"{test_file}::{klass}::{name}"]
                sub = work / name
                seconds, killed = run_job(
                    selection,
                    sub,
                    shim,
                    args.ddl,
                    args.per_test_timeout,
                    args.per_test_timeout + 120,
                    args.np,
                )
                missing = "job killed" if killed else "not reported"
                entry = verdicts(sub, [name], missing, args.np)[name]
                entry["seconds"] = round(seconds, 1)
                result["tests"][name] = entry
                print(f"{entry['verdict']:8s} {seconds:6.1f}s {name}", flush=True)
            result["seconds"] = round(time.monotonic() - start, 1)
    finally:
        shutil.rmtree(shim, ignore_errors=True)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for entry in result["tests"].values():
        counts[entry["verdict"]] += 1
    result["counts"] = counts
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
