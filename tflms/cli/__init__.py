"""The ``tflms`` command: ``tflms analyze | simulate | rewrite`` (see :mod:`tflms.cli.app`).

TensorFlow is imported only once a subcommand runs, so ``tflms --help``,
``tflms --version`` and argument errors answer at once.
"""

from tflms.cli.app import ExitCode, main

__all__ = ["ExitCode", "main"]
