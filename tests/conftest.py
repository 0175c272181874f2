"""Shared test fixtures: quiet TensorFlow, the reference folder, temp dirs."""
import os
import pathlib

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
# Facts read off the original DeepLab, kept with the tests (see its README).
REFERENCE = REPO / 'tests' / 'reference'


@pytest.fixture(scope='session')
def reference_dir():
  return REFERENCE


@pytest.fixture(scope='session')
def repo_dir():
  return REPO
