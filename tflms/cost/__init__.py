"""The cost model: what devices and links are like, and what each op costs on them.

* :mod:`.hardware` - device and link presets (memory, FLOP/s, bandwidth,
  latency), ``get_device``/``get_link``;
* :mod:`.ops` - per-op time on a device: a roofline of FLOPs and bytes moved;
* :mod:`.gpu_memory` - what a TensorFlow GPU process holds beyond its tensors
  (driver, CUDA context, TensorFlow's reserve, cuDNN workspaces), with sources;
* :mod:`.target` - :class:`~tflms.cost.target.Target`: the device, link,
  budget, accounting and stack a plan is made for, resolved once by the front
  ends and passed down (the default device is named there only).

Base layer: it depends on :mod:`tflms.errors` only, so the configuration and
every pipeline stage may use it.
"""
