"""Build hook for the two optional C extensions.

Metadata is in setup.cfg.

* ``ddl_tf.core.numerics.halfkernels`` speeds up float16/bfloat16
  conversions in ddl_tf's host-side reductions;
* ``tflms.simulation.kernels`` runs the simulator's two inner loops (the
  BFC allocator replay and the FirstReady schedule) for every simulated plan.

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
            "tflms.simulation.kernels",
            ["tflms/simulation/kernels.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
