"""Shared test fixtures: quiet TensorFlow, the reference folder, temp dirs,
the benchmark scripts."""
import importlib.util
import os
import pathlib

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# The tests run TensorFlow with the settings every deeplab-* command gives
# its process (oneDNN kernels, the BFC allocator): the float32 results of a
# training step depend on the kernels (tests/test_training_step.py).
from deeplab_train.runtime import cpu as _cpu  # noqa: E402

_cpu.apply_process_settings()

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


@pytest.fixture(scope='session')
def benchmark_script():
  """load(name): benchmarks/{name}.py as a module (the scripts are no
  package)."""
  def load(name):
    spec = importlib.util.spec_from_file_location(
        name, REPO / 'benchmarks' / (name + '.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
  return load
