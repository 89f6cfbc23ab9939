"""Utilities with no knowledge of graphs or plans (and no TensorFlow at import time).

* :mod:`.units` - byte sizes: parse ``"12GiB"``, format ``12.0 GiB``;
* :mod:`.devices` - TensorFlow device strings: parse, compare, check;
* :mod:`.files` - atomic file writes;
* :mod:`.cpu` - the CPU, and whether TensorFlow turns oneDNN and the BFC CPU
  allocator on there;
* :mod:`.gc_pause` - Python's garbage collector paused around graph edits;
* :mod:`.exports` - lazy package exports (PEP 562).
"""
