"""TensorFlow bridge on real ranks: eager and graph collectives, gradients, and ordering.

Ordering proof: many independent collectives (distinct names and shapes) are
created in one graph and executed repeatedly with several inter-op threads,
both in ``tf.function`` and in a ``tf.compat.v1`` graph run by a Session
(where TensorFlow adds no automatic control dependencies, so only ddl_tf's
chain orders them). Any reordering on any rank makes the descriptor check
raise CollectiveMismatchError; the chain structure is inspected as well.
"""

import itertools

import numpy as np
import tensorflow as tf

import ddl_tf as hvd
from ddl_tf.errors import ConfigError
from ddl_tf.tensorflow import bridge
from tests.parallel.workers.common import report

tf.config.threading.set_inter_op_parallelism_threads(4)
failures: list[str] = []


def expect(label, got, expected, tol=1e-6):
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape or not np.allclose(got, expected, atol=tol, rtol=tol):
        failures.append(f"{label}: got {got.ravel()[:6]} expected {expected.ravel()[:6]}")


def eager_and_graph(size, rank):
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) + rank)
    total = sum(np.arange(6, dtype=np.float32).reshape(2, 3) + r for r in range(size))
    rows = tf.ones([rank + 1, 2]) * rank

    def all_ops():
        return (
            hvd.allreduce(x, op=hvd.Sum, name="sum"),
            hvd.allreduce(x, name="avg"),
            hvd.allreduce(x, compression=hvd.Compression.fp16, name="fp16"),
            hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, name="group"),
            hvd.allgather(rows, name="gather"),
            hvd.broadcast(x, root_rank=size - 1, name="bcast"),
            hvd.reducescatter(tf.ones([2 * size + 1, 2]) * (rank + 1), op=hvd.Sum, name="rs"),
            hvd.alltoall(
                tf.reshape(tf.range(2 * size, dtype=tf.float32), [2 * size, 1]) + rank, name="a2a"
            ),
        )

    graph_ops = tf.function(all_ops)
    for mode, outs in (("eager", all_ops()), ("graph", graph_ops())):
        s, a, h, g, gathered, b, rs, a2a = outs
        expect(f"{mode} sum", s, total)
        expect(f"{mode} avg", a, total / size)
        expect(f"{mode} fp16", h, total / size, 1e-2)
        expect(f"{mode} group", g[1], 2 * total)
        expect(
            f"{mode} allgather",
            gathered,
            np.concatenate([np.ones((r + 1, 2)) * r for r in range(size)]),
        )
        expect(f"{mode} broadcast", b, np.arange(6).reshape(2, 3) + size - 1)
        expect(f"{mode} reducescatter rows", rs.shape[0], 3 if rank == 0 else 2)
        expect(f"{mode} reducescatter", rs, np.ones((rs.shape[0], 2)) * size * (size + 1) / 2)
        expect(
            f"{mode} alltoall",
            a2a[:, 0],
            np.array([2 * rank + k + r for r in range(size) for k in range(2)], np.float32),
        )
    concrete = graph_ops.get_concrete_function()
    shapes = [t.shape.as_list() for t in tf.nest.flatten(concrete.structured_outputs)]
    if shapes[0] != [2, 3] or shapes[5] != [None, 2]:
        failures.append(f"static shapes not preserved: {shapes}")
    sparse = tf.IndexedSlices(tf.ones([1, 2]) * rank, tf.constant([rank]), tf.constant([size, 2]))
    dense = tf.convert_to_tensor(hvd.allreduce(sparse, op=hvd.Sum))
    expect("IndexedSlices", dense, np.arange(size)[:, None] * np.ones((1, 2)))


def gradients(size, rank):
    c = [float(r + 1) for r in range(size)]
    v = tf.Variable(np.ones(3, np.float32) * rank)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(v, op=hvd.Sum, name="g_ar") * c[rank])
    expect("allreduce grad", tape.gradient(loss, v), np.ones(3) * sum(c))
    w = tf.Variable(np.ones((rank + 1, 2), np.float32))
    with tf.GradientTape() as tape:
        gathered = hvd.allgather(w, name="g_ag")
        loss = tf.reduce_sum(gathered * c[rank])
    # Horovod 0.28.1: allgather and broadcast gradients average the upstream gradients
    expect("allgather grad", tape.gradient(loss, w), np.ones((rank + 1, 2)) * np.mean(c))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.broadcast(v, root_rank=0, name="g_bc") * c[rank])
    expect("broadcast grad", tape.gradient(loss, v), np.ones(3) * (np.mean(c) if rank == 0 else 0))

    @tf.function
    def tape_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v) * c[rank]
        return hvd.DistributedGradientTape(tape).gradient(loss, [v])[0]

    expect(
        "DistributedGradientTape",
        tape_step(),
        np.ones(3) * np.mean([2 * r * c[r] for r in range(size)]),
    )


def ordering(size, rank):
    shapes = [(k + 1,) for k in range(16)]
    inputs = [tf.constant(np.full(s, rank, np.float32)) for s in shapes]

    @tf.function
    def many(*xs):
        outs = [hvd.allreduce(x, op=hvd.Sum, name=f"order{k}") for k, x in enumerate(xs)]
        # what a graph rewriter such as tflms does: extra Identity ops and control edges
        extra = tf.identity(xs[0])
        for out in outs[::3]:
            out.op._add_control_input(extra.op)
        return outs

    for _ in range(30):
        for k, out in enumerate(many(*inputs)):
            expect(f"order{k}", out, np.full(shapes[k], sum(range(size))))
    graph = many.get_concrete_function(*inputs).graph
    chain = bridge.collective_ops(graph)
    names = [op.name for op in chain]
    if names != [f"DDLAllreduce_order{k}" for k in range(16)]:
        failures.append(f"chain order {names}")
    for previous, op in itertools.pairwise(chain):
        if previous not in op.control_inputs:
            failures.append(f"{op.name} is not chained after {previous.name}")
    # tf.compat.v1 graph + Session: no automatic control dependencies at all
    g = tf.Graph()
    with g.as_default():
        outs = [
            hvd.allreduce(tf.fill([k + 1], float(rank)), op=hvd.Sum, name=f"v1_{k}")
            for k in range(16)
        ]
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    with tf.compat.v1.Session(graph=g, config=config) as sess:
        for _ in range(20):
            values = sess.run(outs)
            for k, value in enumerate(values):
                expect(f"v1_{k}", value, np.full(k + 1, sum(range(size))))


def xla_refused():
    @tf.function(jit_compile=True)
    def compiled(x):
        return hvd.allreduce(x)

    try:
        compiled(tf.ones(2))
        failures.append("allreduce inside jit_compile=True did not raise")
    except Exception as err:  # autograph re-raises it as a StagingError quoting our error
        if not isinstance(err, ConfigError) and "ConfigError" not in str(err):
            failures.append(f"XLA refusal raised {type(err).__name__}: {err}")
        elif "jit_compile=False" not in str(err):
            failures.append(f"unclear XLA error: {err}")


def main():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    eager_and_graph(size, rank)
    gradients(size, rank)
    ordering(size, rank)
    xla_refused()
    hvd.barrier()
    report(rank, {"failures": failures[:40]})
    hvd.shutdown()


if __name__ == "__main__":
    main()
