"""A job ends soon after its last rank, however its ranks end (issue 33, point 5).

Eight short 2-rank jobs under mpirun, each ending another way (see
``workers/clean_end.py``): at exit, through ``shutdown()``, and after a rank's
engine failed (before the fix, a failed rank skipped the shutdown exchange and
its peer waited for it forever, while it waited in ``MPI_Finalize``). Each job
must end within ``END_SECONDS`` of the last rank's ``main`` and exit 0.
"""

import time
from pathlib import Path

import pytest

from tests.timing import END_SECONDS, PROCESS_MARGIN_SECONDS

WORKERS = Path(__file__).parent / "workers"

pytestmark = pytest.mark.parallel

MODES = [
    "plain",
    "failed1",
    "explicit",
    "failed0",
    "early",
    "failed_both",
    "plain",
    "failed1",
]


def test_eight_short_jobs_each_end_soon_after_their_last_rank(mpirun):
    ends = {}
    for i, mode in enumerate(MODES):
        result = mpirun(
            WORKERS / "clean_end.py",
            np=2,
            args=[mode],
            timeout=END_SECONDS + PROCESS_MARGIN_SECONDS,
        ).check()
        finished = time.time()
        out = result.rank_outputs
        assert [o["sum"] for o in out] == [[1.0] * 3] * 2, (mode, out)
        ends[f"{i}:{mode}"] = round(finished - max(o["ended"] for o in out), 2)
    print("seconds from the last rank to the job's end:", ends)
    assert all(0 <= s <= END_SECONDS for s in ends.values()), ends
