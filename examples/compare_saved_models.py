"""Train two SavedModels on the same data and say whether they stay identical.

Meant for a model and its ``tflms rewrite``: both are loaded with
``tf.saved_model.load``, their training function (default ``train``) is
called ``--steps`` times on the same random inputs (shaped by the function's
input signature), and then every variable - read back through a checkpoint
of the loaded object - is compared bit for bit.

    python examples/compare_saved_models.py /tmp/mlp_trainer /tmp/mlp_trainer_lms
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def _inputs(function, steps: int, seed: int):
    concrete = function.concrete_functions[0] if hasattr(function, "concrete_functions") else None
    specs = concrete.structured_input_signature[0] if concrete else ()
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        args = []
        for spec in specs:
            shape = [d if d is not None else 1 for d in spec.shape]
            if spec.dtype.is_integer:
                args.append(rng.integers(0, 10, shape).astype(spec.dtype.as_numpy_dtype))
            else:
                args.append(rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype))
        batches.append(args)
    return batches


def train(path: str, function: str, steps: int, seed: int):
    model = tf.saved_model.load(path)
    fn = getattr(model, function)
    losses = [float(tf.reduce_sum(fn(*args))) for args in _inputs(fn, steps, seed)]
    prefix = tf.train.Checkpoint(root=model).write(os.path.join(tempfile.mkdtemp(), "c"))
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(k for k in reader.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k)
    return losses, {name: reader.get_tensor(name) for name in names}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("original")
    parser.add_argument("rewritten")
    parser.add_argument("--function", default="train", help="the training tf.function's name")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    results = [
        train(p, args.function, args.steps, args.seed) for p in (args.original, args.rewritten)
    ]
    for path, (losses, variables) in zip((args.original, args.rewritten), results, strict=True):
        print(f"{path}: losses {[round(x, 6) for x in losses]}, {len(variables)} variables")
    (loss_a, vars_a), (loss_b, vars_b) = results
    same = (
        loss_a == loss_b
        and vars_a.keys() == vars_b.keys()
        and all(np.array_equal(vars_a[k], vars_b[k]) for k in vars_a)
    )
    print("identical: losses and every variable" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
