"""3D U-Net segmentation of BraTS-like MRI volumes with tflms + ddl_tf (the demo)."""
