"""Failure modes on real ranks: mismatches, stalls, exceptions, deaths.

Usage: reliability.py MODE [TOKEN]. MODE is one of:

* ``mismatch``: ranks issue different collectives (shape, dtype, name, order,
  op, kind, and one inside tf.function); every rank must raise
  CollectiveMismatchError quickly and then continue in step;
* ``stall``: rank 1 arrives late; the others must log warnings naming it;
* ``stall_abort``: rank 1 never arrives; the job must end (StallError);
* ``exception``: rank 1 raises while the others wait in a collective;
* ``kill``: rank 1 is killed with SIGKILL while the others wait;
* ``exit``: rank 1 calls sys.exit(3) while the others wait.

TOKEN only makes the processes findable by the test (orphan check).
"""

import logging
import os
import signal
import sys
import time

import numpy as np

import ddl_tf as hvd
from ddl_tf.core.collectives.reduce_spec import ReduceSpec
from ddl_tf.errors import CollectiveMismatchError
from tests.parallel.workers.common import report


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def mismatch(engine, rank):
    f32 = np.float32
    cases = {
        "shape": lambda: engine.allreduce([np.ones(3 + rank, f32)], name="grad"),
        "dtype": lambda: engine.allreduce([np.ones(3, f32 if rank else np.float64)], name="grad"),
        "name": lambda: engine.allreduce([np.ones(3, f32)], name=f"grad_{rank}"),
        "op": lambda: engine.allreduce([np.ones(3, f32)], ReduceSpec.of("sum" if rank else "max")),
        "kind": lambda: (
            engine.broadcast([np.ones(3, f32)], 0) if rank else engine.allreduce([np.ones(3, f32)])
        ),
        "order": lambda: [
            engine.allreduce([np.ones(3, f32)], name=name)
            for name in (["a", "b"] if rank == 0 else ["b", "a"])
        ],
    }
    results = {}
    for label, call in cases.items():
        start = time.monotonic()
        try:
            call()
            results[label] = {"raised": None}
        except CollectiveMismatchError as err:
            results[label] = {"raised": "CollectiveMismatchError", "message": str(err)}
        results[label]["seconds"] = time.monotonic() - start
    # inside tf.function the error reaches the caller through TensorFlow's runtime
    import tensorflow as tf

    @tf.function
    def step(x):
        return hvd.allreduce(x, name="graph_grad")

    start = time.monotonic()
    try:
        step(tf.ones([2 + rank]))
        results["graph"] = {"raised": None}
    except Exception as err:  # a tf.errors.OpError carrying our message
        results["graph"] = {"raised": type(err).__name__, "message": str(err)[-2000:]}
    results["graph"]["seconds"] = time.monotonic() - start
    # the ranks are still in step afterwards
    after = engine.allreduce([np.ones(2, f32)], ReduceSpec.of("sum"))[0]
    results["after"] = after.tolist()
    return results


def main():
    mode = sys.argv[1]
    recorder = Recorder()
    logging.getLogger("ddl_tf").addHandler(recorder)
    engine = hvd.init()
    rank = hvd.rank()
    payload = {"mode": mode}
    start = time.monotonic()
    if mode == "mismatch":
        payload["cases"] = mismatch(engine, rank)
    elif mode == "stall":
        if rank == 1:
            time.sleep(3.5)
        engine.allreduce([np.ones(4, np.float32)], name="late")
    elif mode == "stall_abort":
        if rank == 1:
            time.sleep(90)  # bounded: the test expects the job to be aborted long before
        engine.allreduce([np.ones(4, np.float32)], name="never")
    elif mode == "exception":
        if rank == 1:
            time.sleep(1)
            raise RuntimeError("rank 1 failed on purpose")
        engine.allreduce([np.ones(4, np.float32)], name="waiting")
    elif mode == "kill":
        if rank == 1:
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        engine.allreduce([np.ones(4, np.float32)], name="waiting")
    elif mode == "exit":
        if rank == 1:
            time.sleep(1)
            sys.exit(3)
        engine.allreduce([np.ones(4, np.float32)], name="waiting")
    payload["seconds"] = time.monotonic() - start
    payload["warnings"] = recorder.messages
    report(rank, payload)
    hvd.shutdown()


if __name__ == "__main__":
    main()
