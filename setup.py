"""Build hook for the two optional C extensions.

Metadata is in setup.cfg.

* ``ddl_tf.core.numerics.halfkernels`` speeds up float16/bfloat16
  conversions in ddl_tf's host-side reductions;
* ``tflms.simulation.bfcreplay`` replays a step's buffers through the BFC
  allocator model, the inner loop of every simulated plan.

Both are optional: without a C compiler the install still succeeds, ddl_tf
converts with numpy and tflms replays in Python (slower, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ddl_tf.core.numerics.halfkernels",
            ["ddl_tf/core/numerics/halfkernels.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "tflms.simulation.bfcreplay",
            ["tflms/simulation/bfcreplay.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
