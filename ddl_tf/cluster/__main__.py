"""``python -m ddl_tf.cluster``; see :mod:`ddl_tf.cluster.cli`."""

import sys

from ddl_tf.cluster.cli import main

sys.exit(main())
