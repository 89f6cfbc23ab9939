"""Build hook for the one optional C extension, ddl_tf.core.numerics.halfkernels.

Metadata is in setup.cfg.

The extension speeds up float16/bfloat16 conversions in ddl_tf's host-side
reductions. It is optional: without a C compiler the install still succeeds
and ddl_tf converts with numpy (slower, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ddl_tf.core.numerics.halfkernels",
            ["ddl_tf/core/numerics/halfkernels.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
