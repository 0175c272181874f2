"""Command-line entry points. Flags are defined and parsed here only.

Importing this package gives the process deeplab-train's environment
settings (runtime/cpu.apply_process_settings) before any command imports
TensorFlow.
"""
from deeplab_train.runtime import cpu as _cpu

_cpu.apply_process_settings()
