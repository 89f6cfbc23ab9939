"""The small examples run as documented (the demo has its own test)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import mpi_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DDLRUN = Path(sys.executable).parent / "ddlrun"


def run(args, timeout=300):
    job = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=mpi_env({})
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    return job.stdout


# The default run of this example is checked line by line against docs/custom-loops.md
# (tests/test_doc_transcripts.py: the same swaps, falling losses, "identical ... True"):
# this shorter run walks the same path, so it is a benchmark-tier repeat (`make bench`).
@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.parallel
def test_custom_loop_with_lms_and_distributed_tape_matches_the_plain_loop():
    out = run([str(DDLRUN), "-np", "2", str(EXAMPLES / "custom_loop.py"), "--steps", "10"])
    swapped = re.search(r"(\d+) tensors swapped", out)
    assert swapped and int(swapped.group(1)) > 0, out
    first, last = map(float, re.search(r"losses .*: ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first
    assert "losses identical to the run without LMS: True" in out
    assert "weights identical on all ranks: True" in out


@pytest.mark.slow
@pytest.mark.parallel
def test_horovod_style_keras_example_on_two_pseudo_nodes():
    argv = [str(DDLRUN), "-np", "2", "--pseudo-nodes", "2", "--algo", "hierarchical"]
    out = run([*argv, str(EXAMPLES / "ddl_tf_keras.py"), "--epochs", "1"])
    assert "ranks: 2" in out and "weights identical on all ranks: True" in out


# Checked line by line against docs/keras.md at its default size
# (tests/test_doc_transcripts.py: the plan, its swaps and the per-layer table), so this
# smaller run is a benchmark-tier repeat (`make bench`).
@pytest.mark.bench
@pytest.mark.slow
def test_lms_keras_example_prints_its_plan():
    out = run([sys.executable, str(EXAMPLES / "lms_keras.py"), "--image-size", "32"])
    swapped = re.search(r"(\d+) tensors swapped", out)
    assert swapped and int(swapped.group(1)) > 0 and "bytes swapped per layer" in out, out


@pytest.mark.parallel
def test_horovod_tf2_gradient_tape_recipe_with_its_two_edits():
    out = run([str(DDLRUN), "-np", "2", str(EXAMPLES / "horovod_tf2_mnist.py"), "--steps", "16"])
    assert "weights identical on all ranks: True" in out
    source = (EXAMPLES / "horovod_tf2_mnist.py").read_text()
    assert source.count("# ddl_tf:") == 4  # the import, opt.build, opt.variables, documented


@pytest.mark.slow
@pytest.mark.parallel
def test_model_state_example_streams_offloads_and_shards_on_two_ranks():
    out = run([str(DDLRUN), "-np", "2", str(EXAMPLES / "model_state.py"), "--steps", "4"])
    streamed = re.search(r"weights on the host: True; (\d+) streamed", out)
    assert streamed and int(streamed.group(1)) > 0, out
    per_rank, replicated = re.search(r"on the host\): ([\d, ]+) of (\d+) replicated", out).groups()
    shards = [int(b) for b in per_rank.split(",")]
    assert len(shards) == 2 and sum(shards) == int(replicated) and max(shards) < int(replicated)
    first, last = map(float, re.search(r"each\): ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first
    assert "weights identical on all ranks: True" in out
