"""Packaging: version metadata and the import error without TensorFlow."""

import subprocess
import sys

import pytest

import ddl_tf
import tflms


@pytest.mark.parametrize("package", ["tflms", "ddl_tf"])
def test_import_without_tensorflow_names_the_extra(package):
    # Setting sys.modules["tensorflow"] = None makes `import tensorflow` raise
    # ImportError exactly as if TensorFlow were not installed.
    code = f"import sys; sys.modules['tensorflow'] = None; import {package}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    extra = "lms" if package == "tflms" else "ddl"
    assert f"tflms-ddl[{extra},cpu]" in proc.stderr and f"tflms-ddl[{extra},gpu]" in proc.stderr


def test_version_comes_from_installed_metadata():
    from importlib.metadata import version

    assert tflms.__version__ == ddl_tf.__version__ == version("tflms-ddl")


def test_error_hierarchies_have_one_base_per_package():
    import inspect

    for module, base in (
        (tflms.errors, tflms.errors.TFLMSError),
        (ddl_tf.errors, ddl_tf.errors.DDLError),
    ):
        classes = [
            obj
            for _, obj in inspect.getmembers(module, inspect.isclass)
            if obj.__module__ == module.__name__
        ]
        assert classes and all(issubclass(cls, base) for cls in classes)
        assert set(module.__all__) == {cls.__name__ for cls in classes}
