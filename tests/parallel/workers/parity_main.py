"""Run the Horovod-parity suite (workers/parity) under pytest on this rank; report the outcome.

Usage (every rank, one mpirun): python parity_main.py. Writes
``junit<rank>.xml`` and, through :func:`tests.parallel.workers.common.report`,
``rank<rank>.json`` with every test's outcome, into ``DDL_TEST_OUTDIR``.
"""

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import ddl_tf as hvd
from tests.parallel.workers.common import report

SUITE = Path(__file__).resolve().parent / "parity"


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | skipped | xfailed}`` from a JUnit file."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case]
        if "failure" in kinds or "error" in kinds:
            result[test] = "failed"
        elif "skipped" in kinds:
            skipped = next(c for c in case if c.tag == "skipped")
            result[test] = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            result[test] = "passed"
    return result


def main() -> None:
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    outdir = Path(os.environ["DDL_TEST_OUTDIR"])
    junit = outdir / f"junit{rank}.xml"
    code = pytest.main(
        [
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfE",
            f"--junitxml={junit}",
            str(SUITE),
        ]
    )
    failures = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                failures[case.get("name")] = (child.get("message") or "")[:500]
    report(rank, {"exit": int(code), "tests": outcomes(junit), "failures": failures})
    hvd.shutdown()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
