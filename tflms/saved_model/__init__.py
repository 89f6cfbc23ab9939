"""Saved models on disk: read, analyse, rewrite and write SavedModels and GraphDef files.

The ``tflms`` command's pipeline on files: :func:`read_model`
(:mod:`~tflms.saved_model.read`), :func:`analyze_model` and
:func:`rewrite_model` (:mod:`~tflms.saved_model.rewrite`, through the proto
editor), :func:`write_model` (:mod:`~tflms.saved_model.write`, atomic). The
source is only ever read.
"""

from tflms.utils.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Model": "tflms.saved_model.read",
        "Target": "tflms.saved_model.read",
        "read_model": "tflms.saved_model.read",
        "ModelAnalysis": "tflms.saved_model.rewrite",
        "TargetAnalysis": "tflms.saved_model.rewrite",
        "analyze_model": "tflms.saved_model.rewrite",
        "rewrite_model": "tflms.saved_model.rewrite",
        "check_destination": "tflms.saved_model.write",
        "write_model": "tflms.saved_model.write",
    },
)
