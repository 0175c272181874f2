"""What this machine's CPU can do, from /proc/cpuinfo, and the speed
settings chosen from it (--mixed_precision=auto), and the environment
settings every deeplab-train command gives its own process.

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
  """cpu_features of this machine plus 'usable_cores' (its affinity) and
  'onednn_limit' (onednn_limit of this process's environment)."""
  try:
    with open(path) as f:
      features = cpu_features(f.read())
  except OSError:
    features = cpu_features('')
  features['usable_cores'] = usable_cores()
  features['onednn_limit'] = onednn_limit()
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


def auto_mixed_precision(features, environ=None):
  """(mode, reason) for --mixed_precision=auto on a CPU with `features`
  in the environment `environ` (default: this process's).

  bf16 only where the CPU has native bfloat16 instructions and oneDNN may
  use them: elsewhere bfloat16 is emulated and training gets slower
  (bf16_held_back). fp16 is never chosen (GPUs: ask for it).
  """
  if not native_bf16(features):
    return 'none', 'this CPU has no native bfloat16 (AVX512_BF16 or AMX)'
  native = 'AMX' if features.get('amx') else 'AVX512_BF16'
  held_back = bf16_held_back(environ)
  if held_back:
    return 'none', 'this CPU has native bfloat16 (%s), but %s' % (native,
                                                                  held_back)
  return 'bf16', 'this CPU has native bfloat16 (%s); %s' % (
      native, measured_auto_gain(native))


def choose_mixed_precision(mode, features=None, environ=None):
  """(mode, reason, refusal) for a --mixed_precision value `mode` on a CPU
  with `features` (default: this machine's) in `environ` (default: this
  process's): auto resolved (auto_mixed_precision, with its reason to
  log); for bf16 asked where auto would not choose it, auto's reason, why
  it trains slower here than float32 (it trained silently); else None.
  refusal: for bf16, why it cannot train here (bf16_refusal), or None.
  Other values come back as they are; the CPU is read only for auto and
  bf16.
  """
  if mode not in (AUTO, 'bf16'):
    return mode, None, None
  features = machine_cpu() if features is None else features
  chosen, reason = auto_mixed_precision(features, environ)
  if mode == AUTO:
    mode = chosen
  elif chosen == 'bf16':
    reason = None
  refusal = bf16_refusal(features, environ) if mode == 'bf16' else None
  return mode, reason, refusal


# oneDNN's cap on the instructions its kernels use: the first of these
# set wins (ALL or a name it does not know caps nothing; any case).
ONEDNN_ISA_ENVS = ('ONEDNN_MAX_CPU_ISA', 'DNNL_MAX_CPU_ISA')
# oneDNN's instruction set levels, lowest first (two names, one level).
_ONEDNN_ISA_LEVELS = {
    'SSE41': 1, 'AVX': 2, 'AVX2': 3, 'AVX2_VNNI': 4, 'AVX2_VNNI_2': 5,
    'AVX512_CORE': 6, 'AVX512_CORE_VNNI': 7, 'AVX512_CORE_BF16': 8,
    'AVX512_CORE_FP16': 9, 'AVX10_1_512': 9,
    'AVX512_CORE_AMX': 10, 'AVX10_1_512_AMX': 10,
    'AVX512_CORE_AMX_FP16': 11, 'AVX10_1_512_AMX_FP16': 11}
_AVX512_CORE = _ONEDNN_ISA_LEVELS['AVX512_CORE']
_NATIVE_BF16 = _ONEDNN_ISA_LEVELS['AVX512_CORE_BF16']
_AMX = _ONEDNN_ISA_LEVELS['AVX512_CORE_AMX']


def onednn_isa_cap(environ=None):
  """('ONEDNN_MAX_CPU_ISA', 'AVX2', level) for the cap oneDNN reads from
  `environ` (default: this process's), or None when it caps nothing."""
  environ = os.environ if environ is None else environ
  for name in ONEDNN_ISA_ENVS:
    value = environ.get(name)
    if value:
      level = _ONEDNN_ISA_LEVELS.get(value.strip().upper())
      return (name, value, level) if level else None
  return None


def onednn_off(environ=None):
  """True when TF_ENABLE_ONEDNN_OPTS in `environ` turns oneDNN off."""
  environ = os.environ if environ is None else environ
  return environ.get(ONEDNN_ENV, '').strip().lower() in ('0', 'false')


def _capped_below(level, environ=None):
  """oneDNN's cap in `environ` (as onednn_isa_cap gives it) where it is
  below `level` (one of _ONEDNN_ISA_LEVELS' values), else None."""
  cap = onednn_isa_cap(environ)
  return cap if cap and cap[2] < level else None


def onednn_limit(environ=None):
  """What in `environ` (default: this process's) keeps oneDNN from the
  CPU's instructions, as words for a report ('off (TF_ENABLE_ONEDNN_OPTS=0)',
  'capped at AVX2 (ONEDNN_MAX_CPU_ISA)'), or None."""
  if onednn_off(environ):
    return 'off (%s=0)' % ONEDNN_ENV
  cap = onednn_isa_cap(environ)
  if cap:
    return 'capped at %s (%s)' % (cap[1].strip().upper(), cap[0])
  return None


def _onednn_uses(feature, level, features, environ=None):
  """Whether oneDNN's kernels use the CPU's `feature` (a cpu_features key)
  under `environ`: the CPU has it, and oneDNN is on and not capped below
  `level` (one of _ONEDNN_ISA_LEVELS' values)."""
  return (bool(features.get(feature)) and not onednn_off(environ)
          and _capped_below(level, environ) is None)


def onednn_avx512(features, environ=None):
  """Whether oneDNN's kernels use AVX-512 on a CPU with `features` under
  `environ` (default: this process's): the CPU has AVX-512, and oneDNN is
  on and not capped below AVX512_CORE."""
  return _onednn_uses('avx512f', _AVX512_CORE, features, environ)


def onednn_amx(features, environ=None):
  """Whether oneDNN's kernels run on AMX tiles on a CPU with `features`
  under `environ` (default: this process's): the CPU has AMX, and oneDNN
  is on and not capped below AVX512_CORE_AMX."""
  return _onednn_uses('amx', _AMX, features, environ)


def onednn_native_bf16(features, environ=None):
  """Whether oneDNN's kernels use the native bfloat16 instructions of a CPU
  with `features` under `environ` (default: this process's): the CPU has
  them (native_bf16), and oneDNN is on and not capped below
  AVX512_CORE_BF16 (bf16_held_back)."""
  return native_bf16(features) and bf16_held_back(environ) is None


def bf16_held_back(environ=None):
  """Why oneDNN cannot use the CPU's native bfloat16 instructions under
  `environ`, or None. Measured on a 2-core AVX512_BF16 CPU (docs/speed.md,
  `deeplab-bench --bench_variants=none,bf16`): bf16 trained 1.2x
  (mobilenet_v2) and 1.6x (xception_65) fp32's images/s; with oneDNN
  capped at AVX512_CORE 0.5x (mobilenet_v2); below that it aborts, and
  with oneDNN off the rewrite does not happen (bf16_refusal).
  """
  if onednn_off(environ):
    return ('%s=0 turns TensorFlow\'s oneDNN kernels off, and with them '
            'the bfloat16 rewrite' % ONEDNN_ENV)
  cap = _capped_below(_NATIVE_BF16, environ)
  if cap:
    return ('%s=%s keeps oneDNN below AVX512_CORE_BF16: bf16 trained at '
            'half fp32\'s speed there (mobilenet_v2)' % cap[:2])
  return None


def bf16_refusal(features, environ=None):
  """Why --mixed_precision=bf16 cannot train on a CPU with `features`
  under `environ`, or None.

  The rewrite is oneDNN's: with oneDNN off it does not happen. On an
  AVX-512 CPU TensorFlow hands bfloat16 ops to oneDNN, which aborts the
  process ("terminate called after throwing an instance of 'dnnl::error'")
  when its instructions are capped below AVX512_CORE.
  """
  if onednn_off(environ):
    # The bfloat16 rewrite is oneDNN's grappler pass: off with it, a bf16
    # run trained float32 to the bit (the same losses), saying bf16.
    return ('%s=0 turns TensorFlow\'s oneDNN kernels off, and with them '
            'the bfloat16 rewrite: the run would train in float32. Unset '
            '%s, or train with --mixed_precision=none' % (ONEDNN_ENV,
                                                         ONEDNN_ENV))
  return bf16_abort(features, environ)


def bf16_abort(features, environ=None):
  """Why a bfloat16 op would abort the process on a CPU with `features`
  under `environ`, or None (see bf16_refusal)."""
  cap = _capped_below(_AVX512_CORE, environ)
  if features.get('avx512f') and not onednn_off(environ) and cap:
    return ('%s=%s keeps oneDNN below AVX512_CORE, and TensorFlow hands '
            'bfloat16 ops to oneDNN on this AVX-512 CPU: the process would '
            'abort in its first step. Unset %s (or set it to AVX512_CORE_BF16 '
            'or higher), or train in float32' % (
                cap[0], cap[1], cap[0]))
  return None


# What bf16 gained over fp32 (training images/s, 2 cores, crop 321,
# mobilenet_v2 OS8 and xception_65 OS16) on each kind of CPU with native
# bfloat16 it was measured on (the EPYC's before the bf16 forms of
# 2026-12-03, not measured there since; the Xeon's on 2026-12-05, on CPU
# family 6 model 207, after the forms of that day: 1.30x and 1.81x on the
# Xeons of 2026-12-04); docs/speed.md has the runs.
AUTO_GAINS = {
    'AVX512_BF16': ('an AMD EPYC with AVX512_BF16', '1.22x', '1.6x'),
    'AMX': ('a Xeon with AMX', '1.43x', '1.87x'),
}


def measured_auto_gain(native):
  """How a user sees what --mixed_precision=auto gains: what it gained on a
  CPU of the same kind (`native`, a key of AUTO_GAINS), and the command that
  measures it on this machine."""
  machine, mobilenet, xception = AUTO_GAINS[native]
  return ('on %s (2 cores, crop 321) bf16 trained %s (mobilenet_v2) and %s '
          '(xception_65) as many images/s as fp32; `deeplab-bench '
          '--bench_variants=none,auto` with these flags measures it on this '
          'machine' % (machine, mobilenet, xception))


# TensorFlow reads this when it makes its CPU allocator. With it, freed
# tensor memory is kept and reused (a best-fit-with-coalescing pool) instead
# of going back to malloc, which maps large blocks fresh for every step: a
# mobilenet_v2 OS8 training step (crop 321, batch 4) took 1.27x less time
# and 4x fewer page faults, with a lower peak RSS (docs/speed.md).
ALLOCATOR_ENV = 'TF_CPU_ALLOCATOR_USE_BFC'
# TensorFlow turns its oneDNN kernels on by itself only on CPUs with
# AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; elsewhere (an AVX2-only CPU)
# batch norm, depthwise convolutions and their gradients run on slower
# kernels. On such a CPU a mobilenet_v2 OS8 training step with batch norm
# trained took 1.17x less time with it on (docs/speed.md); the original's
# float32 results are recorded with it on too (tests/reference/README.md).
ONEDNN_ENV = 'TF_ENABLE_ONEDNN_OPTS'
_PROCESS_SETTINGS = {ALLOCATOR_ENV: 'true', ONEDNN_ENV: '1'}
# What apply_process_settings set (not what the user had set).
_set_here = {}


def apply_process_settings(environ=None):
  """Sets the process settings the user has not set in the environment
  (an explicit value, e.g. TF_CPU_ALLOCATOR_USE_BFC=false or
  TF_ENABLE_ONEDNN_OPTS=0, wins).

  Must run before TensorFlow makes its first allocation; the command-line
  package does it on import. Returns {name: value} of what it set.
  """
  environ = os.environ if environ is None else environ
  added = {name: value for name, value in _PROCESS_SETTINGS.items()
           if name not in environ}
  environ.update(added)
  if environ is os.environ:
    _set_here.update(added)
  return added


def environ_without_own_settings():
  """A copy of os.environ without what apply_process_settings set: the
  environment of another program (e.g. the original trainer measured
  beside deeplab-train), as the user's shell would give it."""
  env = dict(os.environ)
  for name, value in _set_here.items():
    if env.get(name) == value:
      del env[name]
  return env
