"""``python -m tflms.cli``: the ``tflms`` command."""

import sys

from tflms.cli.app import main

sys.exit(main())
