"""The Keras 3 front end: :class:`~tflms.keras.callback.LMSCallback` for ``model.fit``.

* :mod:`.callback` - the callback: plans on the traced train step, rewrites
  it, and restores the model on any failure;
* :mod:`.session` - what one ``fit`` call with the callback changes on the
  model, and how it is undone;
* :mod:`.offload` - :class:`~tflms.keras.offload.OffloadedOptimizer`, the
  optimizer's state and update on the host, and
  :func:`~tflms.keras.offload.weights_on_host`, the weights there (streamed);
* :mod:`.step` - tracing a compiled model's train step into a graph
  (:func:`tflms.analyze`, :func:`tflms.train_step_graph`).

Everything here builds on :mod:`tflms.frontends` (the graph front end all
front ends share) and the pipeline stages below it.
"""

from tflms.keras.offload import OffloadedOptimizer, offload_state, weights_on_host

__all__ = ["OffloadedOptimizer", "offload_state", "weights_on_host"]
