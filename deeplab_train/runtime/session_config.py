"""The session ConfigProto of a training run: threads and mixed precision.

These speed settings live in the session config rather than in the graph
(fp32 variables, fp32 loss), so the checkpoints do not depend on them:

- threads: intra-op (inside one op, e.g. a convolution) and inter-op
  (independent ops at once) thread pools sized to the usable cores;
- grappler: one optimization pass, no GPU memory rewrites without a GPU
  (start-up time; the step's graph is the same);
- XLA: not here. `--use_xla` marks the network (and its gradients) for
  compilation in the graph (see train/graph.py): session-wide
  auto-clustering (`global_jit_level`, plus `cpu_global_jit` on CPU) also
  clusters the tf.data functions, and fails on their run-time shapes;
- mixed precision: grappler's automatic mixed-precision rewrite, which
  casts the compute of convolutions, matmuls and their neighbours to a
  16-bit type while variables stay fp32 and numerically sensitive ops
  (softmax cross-entropy, reductions, exp/log) stay in fp32:
    'bf16': the oneDNN bfloat16 rewrite (CPU with AVX512_BF16 / AMX);
    'fp16': the float16 rewrite for GPUs; it needs loss scaling, which is
            in the training graph (see `loss_scale.py`), not here.
  Build the training graph with the mode it runs with: for fp32 ('none')
  the towers compute small-rate dilated depthwise convolutions with
  oneDNN's dilated kernel (layers.dilated_depthwise_in_one_op), which a
  session with the bf16 rewrite could not run on an AVX2 CPU.
"""

import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from deeplab_train import config as config_lib
from deeplab_train.runtime import cpu as cpu_lib

MIXED_PRECISION_MODES = config_lib.MIXED_PRECISION_MODES


# Re-exported: sizes the thread pools.
usable_cores = cpu_lib.usable_cores


def validate_mixed_precision(mode):
  """Returns `mode` when known.

  Raises:
    ConfigError: not one of MIXED_PRECISION_MODES.
  """
  config_lib.check_one_of('{TrainOptions.mixed_precision}', mode,
                          MIXED_PRECISION_MODES)
  return mode


def make_session_config(mixed_precision='none', intra_op_threads=None,
                        inter_op_threads=None, allow_soft_placement=True,
                        cpu_devices=None):
  """Builds the tf.ConfigProto of a training (or benchmark) session.

  Args:
    mixed_precision: 'none', 'bf16' (oneDNN bfloat16 rewrite, CPU) or
      'fp16' (float16 rewrite, GPU).
    intra_op_threads: threads inside one op; None: every usable core;
      0: TensorFlow's choice.
    inter_op_threads: ops run at once; None: every usable core; 0:
      TensorFlow's choice.
    allow_soft_placement: put ops without a kernel on the requested
      device (e.g. no GPU kernel) on the CPU.
    cpu_devices: number of CPU devices (towers on '/cpu:i'), or None.

  Returns:
    A tf.ConfigProto.

  Raises:
    ValueError: unknown mixed-precision mode or a negative thread count.
  """
  validate_mixed_precision(mixed_precision)
  cores = usable_cores()
  intra = cores if intra_op_threads is None else intra_op_threads
  inter = cores if inter_op_threads is None else inter_op_threads
  if intra < 0 or inter < 0:
    raise ValueError('thread counts must be >= 0 (0: TensorFlow decides), '
                     'got intra_op=%d inter_op=%d' % (intra, inter))
  config = tf.ConfigProto(allow_soft_placement=allow_soft_placement,
                          intra_op_parallelism_threads=intra,
                          inter_op_parallelism_threads=inter)
  if cpu_devices:
    config.device_count['CPU'] = cpu_devices
  rewrite = config.graph_options.rewrite_options
  on = rewriter_config_pb2.RewriterConfig.ON
  # Grappler optimizes the graph again for each new set of fetches (the
  # initializers, the first step with summaries, the steps without, the
  # saver): seconds at every start for a large model. Its second pass
  # over the training step changed nothing but 92 duplicate nodes (of
  # 12k, xception_65), so one pass; the memory optimizer's rewrites
  # (swapping to host memory, recomputation) are for GPUs and changed no
  # node of the CPU graphs. xception_65, 3 steps: 21.6 s of grappler time
  # before, 10.2 s after (docs/speed.md, "Start-up").
  rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
  if not gpus_visible():
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
  if mixed_precision == 'bf16':
    rewrite.auto_mixed_precision_onednn_bfloat16 = on
  elif mixed_precision == 'fp16':
    # GPU only: without a GPU grappler skips it with a warning. (Its CPU
    # emulation, `auto_mixed_precision_cpu`, crashes TF 2.21 on this graph.)
    rewrite.auto_mixed_precision = on
  return config


def gpus_visible():
  """Whether TensorFlow sees a GPU in this process."""
  return bool(tf.config.list_physical_devices('GPU'))


def onednn_kernels_on():
  """Whether this process runs TensorFlow's oneDNN CPU kernels (the
  commands turn them on, cpu.apply_process_settings; TensorFlow itself on
  CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX)."""
  try:
    # TensorFlow's own test utilities ask this private module.
    # pylint: disable-next=g-import-not-at-top
    from tensorflow.python.util import _pywrap_util_port
  except ImportError:  # a TensorFlow without it: off, the safe answer
    return False
  return bool(_pywrap_util_port.IsMklEnabled())


def from_train_options(train_options, cpu_devices=None):
  """The session config of `make_session_config` for a TrainOptions.

  Args:
    train_options: TrainOptions (mixed_precision, thread counts).
    cpu_devices: number of CPU devices, or None.

  Returns:
    A tf.ConfigProto.
  """
  return make_session_config(
      train_options.mixed_precision,
      intra_op_threads=train_options.intra_op_parallelism_threads,
      inter_op_threads=train_options.inter_op_parallelism_threads,
      cpu_devices=cpu_devices)
