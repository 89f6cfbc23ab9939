"""Floating-point tolerances with a reason that holds on every CPU.

Two TensorFlow kernels that compute the same value (fused and unfused batch
norm; Eigen's and oneDNN's convolution, which TensorFlow picks by CPU and by
``TF_ENABLE_ONEDNN_OPTS``) sum in different orders, so their results differ by
rounding. A test comparing them needs a bound on the rounding error of a sum
that holds for *any* summation order, not the difference one machine showed.

Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed., 2002), (4.4):
a sum of ``n`` floating-point numbers computed in any order (serial, pairwise,
blocked, vectorised, multithreaded) has

    |computed - exact| <= gamma_{n-1} * sum(|x_i|),
    gamma_k = k*u / (1 - k*u),  u = eps / 2  (the unit roundoff, round to nearest).

An inner product ``sum(a_i * b_i)`` of ``n`` terms has ``gamma_n`` (one more
rounding, for the products; a fused multiply-add only removes roundings), and
so has a sum whose terms were each computed by one rounded operation: count
every such elementwise rounding as one more term (Higham's Lemma 3.1: ``k``
roundings multiply a value by ``1 + theta_k``, ``|theta_k| <= gamma_k``).
"""

from __future__ import annotations

import numpy as np

EPS16 = float(np.finfo(np.float16).eps)
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)


def summation_bound(n_terms, magnitude, eps=EPS32):
    """Worst-case rounding error of a sum of ``n_terms`` terms in any order.

    ``magnitude`` is the sum of the terms' absolute values (a float, or a numpy
    array for elementwise bounds); ``eps`` is the format's machine epsilon.
    Returns ``gamma_{n_terms-1} * magnitude`` (Higham (4.4)), which is about
    ``(n_terms - 1) * eps / 2 * magnitude``.

    >>> summation_bound(1, 5.0)  # one term: nothing is rounded
    0.0
    >>> 2048 * 2**-24 < summation_bound(2049, 1.0) < 2048 * 2**-24 * 1.001
    True
    >>> summation_bound(3, np.array([1.0, 2.0]), eps=EPS64) / EPS64
    array([1., 2.])
    """
    k = max(int(n_terms) - 1, 0)
    ku = k * eps / 2
    if ku >= 1:
        raise ValueError(f"no bound: {n_terms} terms at eps={eps} (n * u >= 1)")
    return ku / (1 - ku) * magnitude
