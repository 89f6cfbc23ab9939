"""The main job: a 3D U-Net trained with tflms (LMS) and ddl_tf (data parallel).

    ddlrun -np 2 examples/unet3d_demo.py [--size 32] [--epochs 12] [--data DIR] [--out out/demo]

``make demo`` runs exactly this. See ``examples/unet3d/train.py`` for the
flags (``--help``) and ``examples/unet3d/data.py`` for the data layout.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # make `examples` importable

from examples.unet3d.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
