#!/usr/bin/env python3
"""Runs the Python bindings' tests with pytest (ctest's PythonBindings); exits 77, saying why, when
the fitllm package or pytest is not installed in this interpreter (scripts/setup.sh --python)."""
import sys

try:
    import pytest
except ImportError:
    print("skipped: pytest is not installed (scripts/setup.sh --python installs it)")
    sys.exit(77)
try:
    import fitllm  # noqa: F401
except ImportError as e:
    print(f"skipped: the fitllm package is not installed ({e}); scripts/setup.sh --python installs it")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__.rsplit("/", 1)[0]] + sys.argv[1:]))
