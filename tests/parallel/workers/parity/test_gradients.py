"""Gradients of the collectives, as Horovod 0.28.1 defines them (documented in
docs/migrating-from-horovod.md):

* allreduce(op): allreduce of the upstream gradient with the same op and factors;
* allgather: average over ranks of the upstream gradient, this rank's rows;
* broadcast: average over ranks of the upstream gradient on the root, 0 elsewhere;
* reducescatter: allgather of the upstream gradient, times size for Sum, times the factors;
* alltoall: alltoall of the upstream gradient back with the received splits.

Each rank weights its loss by its own constant ``c[rank]`` so that a sum
and an average of the upstream gradients differ.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ddl_tf as hvd


def weights(size: int) -> list[float]:
    return [float(2 * r + 1) for r in range(size)]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_allgather_gradient_is_the_average_over_ranks(rank, size, graph):
    c = weights(size)
    x = tf.Variable(tf.ones([rank + 1, 2]))

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(hvd.allgather(x) * c[rank])
        return tape.gradient(loss, x)

    got = (tf.function(grad) if graph else grad)()
    np.testing.assert_allclose(got.numpy(), np.full((rank + 1, 2), np.mean(c)))


def test_grouped_allgather_gradient_is_the_average_over_ranks(rank, size):
    c = weights(size)
    xs = [tf.Variable(tf.ones([rank + 1])), tf.Variable(tf.ones([1, 3], tf.float64))]
    with tf.GradientTape() as tape:
        gathered = hvd.grouped_allgather(xs)
        second = tf.cast(tf.reduce_sum(gathered[1]) * 2.0, tf.float32)
        loss = tf.reduce_sum(gathered[0]) * c[rank] + second
    g0, g1 = tape.gradient(loss, xs)
    np.testing.assert_allclose(g0.numpy(), np.full(rank + 1, np.mean(c)))
    np.testing.assert_allclose(g1.numpy(), np.full((1, 3), 2.0))


@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_gradient_is_the_average_on_the_root_and_zero_elsewhere(rank, size, root):
    c = weights(size)
    x = tf.Variable(tf.ones([3]) * rank)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.broadcast(x, root_rank=root) * c[rank])
    expected = np.mean(c) if rank == root else 0.0
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), np.full(3, expected))


@pytest.mark.parametrize(
    ("op", "pre", "post"),
    [("sum", 1.0, 1.0), ("average", 1.0, 1.0), ("sum", 0.5, 3.0)],
)
def test_reducescatter_gradient_is_the_allgather_scaled_for_sum(rank, size, op, pre, post):
    c = weights(size)
    x = tf.Variable(tf.ones([2 * size, 3]))
    with tf.GradientTape() as tape:
        out = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
        loss = tf.reduce_sum(out) * c[rank]
    scale = (size if op == "sum" else 1) * pre * post
    expected = np.repeat(np.array(c) * scale, 2)[:, None] * np.ones((1, 3))
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), expected)


def test_grouped_reducescatter_gradient(rank, size):
    c = weights(size)
    xs = [tf.Variable(tf.ones([size])), tf.Variable(tf.ones([size, 2]))]
    with tf.GradientTape() as tape:
        outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
        loss = (tf.reduce_sum(outs[0]) + tf.reduce_sum(outs[1])) * c[rank]
    g0, g1 = tape.gradient(loss, xs)
    np.testing.assert_allclose(g0.numpy(), np.array(c) * size)
    np.testing.assert_allclose(g1.numpy(), (np.array(c) * size)[:, None] * np.ones((1, 2)))


@pytest.mark.parametrize("op", ["sum", "average", "max"])
def test_allreduce_gradient_is_the_allreduce_of_the_gradient(rank, size, op):
    c = weights(size)
    x = tf.Variable(tf.ones([2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hvd.allreduce(x, op=op)) * c[rank]
    expected = {"sum": sum(c), "average": np.mean(c), "max": max(c)}[op]
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), np.full(2, expected))


def test_alltoall_gradient_sends_the_gradient_back(rank, size):
    c = weights(size)
    x = tf.Variable(tf.ones([size, 2]))
    with tf.GradientTape() as tape:
        received = hvd.alltoall(x)  # row r goes to rank r
        loss = tf.reduce_sum(received) * c[rank]
    # row r of this rank's input went to rank r, whose loss weight is c[r]
    expected = np.array(c)[:, None] * np.ones((1, 2))
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), expected)


def test_gradients_in_a_compat_v1_graph(rank, size):
    c = weights(size)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        x = tf.ones([rank + 1, 2])
        gathered = hvd.allgather(x)
        (grad,) = tf.compat.v1.gradients(gathered * c[rank], [x])
        assert session.run(grad).tolist() == np.full((rank + 1, 2), np.mean(c)).tolist()
