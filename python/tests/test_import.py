"""The package imports from the build tree and says its version."""
import re

import microllm


def test_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", microllm.__version__)


def test_errors_are_python_exceptions():
    assert issubclass(microllm.Error, RuntimeError)
    assert issubclass(microllm.ShapeError, microllm.Error)
    assert issubclass(microllm.ShapeError, ValueError)
    assert issubclass(microllm.IoError, OSError)
