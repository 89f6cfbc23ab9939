"""Every notebook runs top to bottom (nbclient, small settings, a time limit).

Notebooks run in place (``notebooks/`` is their working directory, as in
Jupyter) and write their pictures under ``out/notebooks/`` (git-ignored);
the committed files are not modified.
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == [
        "01_large_model_support.ipynb",
        "02_distributed_training.ipynb",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        # per cell: the LMS notebook's capacity cell (some 25 auto-tunings) takes about 170 s
        # alone and 220 s beside the suite's other worker; 300 s timed it out on a busier machine
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first failure
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors, errors
