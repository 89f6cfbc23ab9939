"""Horovod's environment knobs under a real mpirun: levels, equivalents, one warning for the rest."""

from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel


def test_horovod_knobs_are_honoured_mapped_or_warned_once(mpirun):
    env = {
        "HOROVOD_LOG_LEVEL": "trace",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "HOROVOD_CYCLE_TIME": "5",
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_TIMELINE": "DYNAMIC",
        "DDL_PSEUDO_NODES": "2",
    }
    result = mpirun(WORKERS / "horovod_knobs.py", np=2, env=env, timeout=240).check()
    assert [o["algorithm"] for o in result.rank_outputs] == ["hierarchical"] * 2
    err = result.stderr
    # trace is a Horovod level: it means DEBUG, and the lines reach stderr on every rank
    assert "[ddl_tf rank 0] DEBUG" in err and "[ddl_tf rank 1] DEBUG" in err, err[-3000:]
    ignored = [line for line in err.splitlines() if "ddl_tf ignores" in line]
    assert len(ignored) == 1 and "[ddl_tf rank 0]" in ignored[0], ignored
    assert "HOROVOD_CYCLE_TIME" in ignored[0] and "HOROVOD_AUTOTUNE" in ignored[0]
    assert result.stdout.count("finished learning-rate warmup") == 1  # verbose=1, rank 0
    assert not (Path.cwd() / "DYNAMIC").exists()
