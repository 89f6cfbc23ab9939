"""The graph front ends: the pipeline run on one TensorFlow graph, for any caller.

* :mod:`.lms` - :class:`~tflms.frontends.lms.LMS`: analyze, plan (or
  autotune), apply and validate one ``tf.Graph``/``FuncGraph``; the Keras
  callback and the decorator run it on the graphs they trace, and
  ``tf.compat.v1`` users call it on theirs;
* :mod:`.decorator` - :func:`tflms.function`, ``tf.function`` with LMS, for
  custom training loops.
"""
