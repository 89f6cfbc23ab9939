"""Runnable examples (importable for tests: ``examples.unet3d``)."""
