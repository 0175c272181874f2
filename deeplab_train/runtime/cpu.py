"""What this machine's CPU can do, from /proc/cpuinfo, and the speed
settings chosen from it (--mixed_precision=auto).

No TensorFlow here: flags are resolved before it is imported.
"""
import os

# The flag value resolved by `auto_mixed_precision`.
AUTO = 'auto'


def cpu_features(cpuinfo_text):
  """The CPU's model and the vector/matrix features that matter here.

  Args:
    cpuinfo_text: the text of /proc/cpuinfo.

  Returns:
    {'model_name', 'logical_cpus', 'avx2', 'avx512f', 'avx512_bf16', 'amx'}
    (features as booleans; those of the first processor listed).
  """
  model, flags, count = None, None, 0
  for line in cpuinfo_text.splitlines():
    key, _, value = line.partition(':')
    key = key.strip()
    if key == 'processor':
      count += 1
    elif key == 'model name' and model is None:
      model = value.strip()
    elif key == 'flags' and flags is None:
      flags = set(value.split())
  flags = flags or set()
  return {'model_name': model, 'logical_cpus': count,
          'avx2': 'avx2' in flags, 'avx512f': 'avx512f' in flags,
          'avx512_bf16': 'avx512_bf16' in flags,
          'amx': bool(flags & {'amx_tile', 'amx_bf16', 'amx_int8'})}


def machine_cpu(path='/proc/cpuinfo'):
  """cpu_features of this machine plus 'usable_cores' (its affinity)."""
  try:
    with open(path) as f:
      features = cpu_features(f.read())
  except OSError:
    features = cpu_features('')
  features['usable_cores'] = usable_cores()
  return features


def usable_cores():
  """Cores this process may run on (its CPU affinity, else the CPU count)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def native_bf16(features):
  """True when the CPU computes bfloat16 natively (AVX512_BF16 or AMX)."""
  return bool(features.get('avx512_bf16') or features.get('amx'))


def auto_mixed_precision(features):
  """(mode, reason) for --mixed_precision=auto on a CPU with `features`.

  bf16 only where the CPU has native bfloat16 instructions: elsewhere
  oneDNN emulates it and training gets slower. fp16 is never chosen (GPUs:
  ask for it).
  """
  if native_bf16(features):
    return 'bf16', 'this CPU has native bfloat16 (%s)' % (
        'AMX' if features.get('amx') else 'AVX512_BF16')
  return 'none', 'this CPU has no native bfloat16 (AVX512_BF16 or AMX)'
