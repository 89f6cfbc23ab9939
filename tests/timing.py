"""Time bounds the suite asserts: they catch hangs; they measure nothing.

A test asserts the behaviour (the error, the exit status, who stopped) and
bounds only how long it may take to come, so that a hang fails the test
instead of the whole run. The same 2-core machine runs the suite about three
times slower when it is loaded (41 minutes against 14 were seen), so a bound
close to a normal run time fails for the machine's load, not for the code:
each bound here is at least ten times the normal figure, and each caller's
own process timeout is longer still, so the assertion (with its message) is
what fails first. Speed is measured by the benchmarks (``make bench``), side
by side in one run.
"""

#: An error, an abort or a signal's effect that normally arrives within a few
#: seconds (a collective mismatch: under 1 s; a stalled rank's shutdown: its
#: 3 s setting plus the abort; ddlrun forwarding a signal: under 2 s).
HANG_SECONDS = 120.0

#: What a caller gives its process (mpirun, a subprocess) on top of the bound it
#: asserts, so that the assertion, not the kill, reports a slow case.
PROCESS_MARGIN_SECONDS = 60.0

#: How long after its last rank's ``main`` returned a job may take to end: the
#: shutdown at exit, ``MPI_Finalize`` and mpirun's teardown take about 0.2 s
#: here, a rank waiting for a peer that already left takes forever.
END_SECONDS = 15.0
