"""Shared test fixtures: quiet TensorFlow, the reference folder, temp dirs."""
import os
import pathlib

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
# ../shared/reference beside the repository (CI lays a copy there too).
REFERENCE = pathlib.Path(
    os.environ.get('DEEPLAB_REFERENCE_DIR', REPO.parent / 'shared' / 'reference'))


@pytest.fixture(scope='session')
def reference_dir():
  if not REFERENCE.is_dir():
    pytest.fail('reference folder not found at %s (set DEEPLAB_REFERENCE_DIR)'
                % REFERENCE)
  return REFERENCE


@pytest.fixture(scope='session')
def repo_dir():
  return REPO
