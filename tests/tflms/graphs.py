"""Tiny hand-built TF1-style graphs with hand-derivable levels and swaps.

Their activations are ``LeakyRelu`` ops (alpha 0: a ReLU's values): on the CPU,
Grappler composes a chain of ReLUs (or other element-wise unary ops) into one
``_UnaryOpsComposition`` kernel, so tflms keeps swap-in triggers and wait edges
off such a chain (``tflms.graph.grappler_rules.in_a_fold``), and these graphs
stand for the activation chains a GPU runs, where nothing composes them.
"""

from __future__ import annotations

import tensorflow as tf

WIDTH = 1024  # float32 columns: a [B, 1024] tensor is 4 KiB per sample


def relu(x, name: str):
    """A ReLU that no Grappler stage composes with its neighbours (see above)."""
    return tf.nn.leaky_relu(x, alpha=0.0, name=name)


def chain_with_skip(n: int = 12, batch: int | None = 8, skip_from: int = 1):
    """x -> h0 -> ... -> h{n-1} -> out = h{n-1} + h{skip_from}.

    Levels: x is 0, h_i is i + 1, out is n + 1. ``h{skip_from}`` is read by
    ``h{skip_from+1}`` (near) and by ``out`` (far).
    """
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, WIDTH], name="x")
        h = x
        hs = []
        for i in range(n):
            h = relu(h, name=f"h{i}")
            hs.append(h)
        tf.add(hs[-1], hs[skip_from], name="out")
    return g


def diamond(batch: int = 8):
    """x -> a -> (b, c) -> d, plus a long tail from d and a skip from a to the end."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, WIDTH], name="x")
        a = relu(x, name="a")
        b = relu(a, name="b")
        c = tf.nn.sigmoid(a, name="c")
        d = tf.add(b, c, name="d")
        t = d
        for i in range(10):
            t = relu(t, name=f"t{i}")
        tf.multiply(t, a, name="end")
    return g


def fan_out(taps=(8, 10, 20), n: int = 24, batch: int = 8):
    """A chain h0..h{n-1}; ``tap_k = h_k + h1`` for each k in ``taps``.

    ``h1`` (level 2) has far consumers ``tap_k`` at level k + 2.
    """
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, WIDTH], name="x")
        h, hs = x, []
        for i in range(n):
            h = relu(h, name=f"h{i}")
            hs.append(h)
        for k in taps:
            tf.add(hs[k], hs[1], name=f"tap{k}")
    return g


def long_chain(x, n: int, prefix: str):
    for i in range(n):
        x = relu(x, name=f"{prefix}{i}")
    return x
