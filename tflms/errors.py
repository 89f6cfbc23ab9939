"""Exceptions raised by tflms.

Every error tflms raises on purpose is a :class:`TFLMSError`, so callers can
catch the whole family with one ``except``. The subclasses say which stage
failed; their messages name the offending thing, echo the value and say how to
fix it.

Example:
    >>> from tflms.errors import ConfigError, TFLMSError
    >>> issubclass(ConfigError, TFLMSError) and issubclass(ConfigError, ValueError)
    True
"""

__all__ = [
    "TFLMSError",
    "ConfigError",
    "UnsupportedGraphError",
    "AlreadyRewrittenError",
    "ValidationError",
    "PlanInfeasibleError",
    "ModelFormatError",
    "ModelNotFoundError",
    "OutputError",
]


class TFLMSError(Exception):
    """Base class of every error raised by tflms."""


class ConfigError(TFLMSError, ValueError):
    """An :class:`~tflms.LMSConfig` field (or CLI flag) has an invalid value."""


class UnsupportedGraphError(TFLMSError):
    """The graph holds something tflms cannot analyse or rewrite safely."""


class AlreadyRewrittenError(TFLMSError):
    """A swap plan was applied to a graph that already holds tflms swap ops."""


class ValidationError(TFLMSError):
    """A rewritten graph breaks an invariant checked by :func:`tflms.validate`."""


class PlanInfeasibleError(TFLMSError):
    """No swap plan brings the predicted peak under the memory budget.

    Attributes:
        budget_bytes: the budget that was asked for.
        best_peak_bytes: the smallest peak any searched plan achieved.
        usable_bytes: what a plan's device peak had to stay under (the
            budget less the safety margin); ``None`` when the host budget,
            not the device's, is what no plan met.
    """

    def __init__(self, message, *, budget_bytes=None, best_peak_bytes=None, usable_bytes=None):
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.best_peak_bytes = best_peak_bytes
        self.usable_bytes = usable_bytes


class ModelFormatError(TFLMSError):
    """A model file or directory is missing, unreadable or not the expected format."""


class ModelNotFoundError(ModelFormatError):
    """A model path does not exist or cannot be read (permissions, a directory
    where a file is expected, an I/O error)."""


class OutputError(TFLMSError):
    """The rewritten model cannot be written where asked (the destination
    exists, lies inside the source, or a write failed)."""
