"""One rank of :func:`ddl_tf.run`: call the pickled function, write what it returns.

``python -m ddl_tf.launch.run_fn FOLDER`` reads ``FOLDER/call.pkl``
(``(func, args, kwargs)``), calls the function and writes
``FOLDER/result.<rank>.pkl`` atomically, ``<rank>`` being the rank in the
job when the function returns (the final membership of an elastic job), or
MPI's rank if the function never initialized ddl_tf.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from ddl_tf import env

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Call the function of ``FOLDER/call.pkl`` and write its result (returns 0)."""
    folder = Path((argv if argv is not None else sys.argv[1:])[0])
    func, args, kwargs = pickle.loads((folder / "call.pkl").read_bytes())
    result = func(*args, **kwargs)
    from ddl_tf.core import basics  # after the call: the function initializes ddl_tf

    if basics.is_initialized():
        rank = basics.rank()
    else:
        rank = int(env.get(env.OMPI_COMM_WORLD_RANK) or env.get(env.PMI_RANK) or 0)
    target = folder / f"result.{rank}.pkl"
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(pickle.dumps(result))
    partial.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
