"""pytest collects examples/ for doctests (setup.cfg): scripts that train at import are skipped.

``horovod_tf2_keras_mnist_elastic.py`` keeps Horovod's recipe as it is, a
script whose module body trains; tests/examples/test_elastic_examples.py runs
it under ddlrun instead.
"""

collect_ignore = ["horovod_tf2_keras_mnist_elastic.py"]
