"""Grappler bridge: TensorFlow's own GPU memory simulator and optimizer, offline.

There is no GPU on our machines, so TensorFlow's Grappler is the independent
reference for GPU peak memory. :func:`grappler_peak` places a graph on a
virtual GPU (``VirtualCluster``, ``DeterminePeakMemoryUsage``) and
:func:`grappler_optimize` runs Grappler's default optimizer pipeline on it, as
TensorFlow would on a GPU machine. Both build the same MetaGraph: fetches
registered as ``train_op``, ops placed on ``host_device`` kept on a virtual
CPU, every other op on the virtual GPU, captured variables turned into
``VarHandleOp`` nodes that carry their shapes. Every number is simulated.

How Grappler counts (read from the TF sources, measured on TF 2.21 and checked
by ``tests/tflms/test_grappler.py``):

* Schedule: the analytical cost model times each op; a FirstReady scheduler
  runs ready ops in order of readiness (ties by name). ``GraphMemory`` then
  charges every output a fresh buffer from its producer's start until 1 ns
  after its last *data* consumer ends (control edges never extend a life).
* Resolution: times are whole microseconds. Ops shorter than 1 us start "at
  once", so on tiny graphs the peak approaches the sum of all tensors; use
  tensors of about 1 MB or more, or ``slowdown=100``.
* The next op starts exactly when its predecessor ends, so its outputs overlap
  the predecessor's dying inputs for 1 ns: the peak includes them.
* Check by hand: a training step of L layers ``relu(h @ W)`` (activations of
  A bytes, weights of W bytes, loss ``sum``, SGD) peaks at exactly
  (L + 4) A + (L - 1) W + 4 L + 8 bytes: the input and the L ReLU outputs kept
  for the backward pass, the upstream gradient, the first ReluGrad, the last
  pre-activation (the overlap above); the reads of W_1..W_L-1; scalars.
* Shapes: a placeholder dimension left unknown is sized as 1 (Grappler feeds a
  fake tensor of that size), so the peak is silently too small. Hence
  ``batch_size`` / ``input_shapes``, and an error while one stays unknown.
* Inputs and constants: allocated at time 0, freed after their last consumer.
* Variables and optimizer slots are not persistent memory there: a resource
  handle weighs 0 bytes and each ``ReadVariableOp`` output is a new buffer from
  the read to its last consumer. Reads need only the handle, so they run at
  time 0: an Adam slot read for the update at the end is charged the whole
  step, and a weight whose read is dead at the peak is not counted at all.
  :attr:`GrapplerPeak.variable_bytes` and
  :attr:`GrapplerPeak.peak_with_variables_bytes` correct for this.
* Identity is a copy, on either device (a new buffer, the input kept until it
  ends), yet costs no time, and neither do ``_Send``/``_Recv``: transfers are
  free, so Grappler says nothing about swap overhead. Across devices the source
  tensor lives on its device until the remote consumer ends, and the ``_Recv``
  buffer is charged on the receiving device only for its own instant: one
  swapped tensor of A bytes costs the host 2 A (``_Recv`` buffer + Identity).
* Swapping: routing an activation through an Identity on the host and back
  saves nothing without a trigger (the swap-in runs as soon as the data is
  there) and saves exactly A with a control edge from a late backward op.
* Only the fan-in of the fetches is simulated. Function calls and functional
  control flow (``PartitionedCall``, ``While``...) are black boxes: run
  ``grappler_peak(grappler_optimize(g))`` to inline them first (the item is
  otherwise simulated unoptimized: no folding, fusion or layout change).
* Grappler's dependency optimizer deletes Identity ops, even across devices
  and with a control trigger, unless they carry ``_grappler_do_not_remove``
  (honoured: ``GrapplerItem::NodesToPreserve``). It skips graphs under 4 nodes
  unless ``min_graph_nodes=-1``, which :func:`grappler_optimize` sets.
"""

from tflms.simulation.grappler.devices import (
    GIB,
    SIMULATOR,
    VIRTUAL_GPU,
    VIRTUAL_GPU_BYTES,
    make_cluster,
    make_item,
    virtual_cpu,
    virtual_gpu,
)
from tflms.simulation.grappler.metagraph import Prepared, prepare_metagraph, warn_black_boxes
from tflms.simulation.grappler.optimize import grappler_optimize
from tflms.simulation.grappler.peak import GrapplerPeak, LiveTensor, grappler_peak

__all__ = [
    "GIB",
    "SIMULATOR",
    "VIRTUAL_GPU",
    "VIRTUAL_GPU_BYTES",
    "LiveTensor",
    "GrapplerPeak",
    "Prepared",
    "grappler_peak",
    "grappler_optimize",
    "make_cluster",
    "make_item",
    "prepare_metagraph",
    "virtual_gpu",
    "virtual_cpu",
    "warn_black_boxes",
]
