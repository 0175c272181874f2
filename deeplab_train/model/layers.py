"""Convolution and batch-norm layers whose variables carry slim's names.

The original DeepLab was built with tf_slim; its checkpoints (the model zoo)
name variables `<scope>/weights`, `<scope>/biases`,
`<scope>/depthwise_weights` and `<scope>/BatchNorm/{beta,gamma,moving_mean,
moving_variance}`. These functions create exactly those variables with
`tf.compat.v1.get_variable`, so a zoo checkpoint restores with no mapping.

Instead of slim's arg_scope, each layer takes a `ConvParams` saying how it is
regularised and normalised; each network part builds its own (the BN decay and
epsilon differ per part). Regularisation losses and BN update ops are not
fished out of graph collections by the caller: build the network inside
`recording()` and read them off the returned `Recorder`.
"""
import contextlib
import dataclasses
import threading
from typing import Callable, List, Optional, Tuple

import tensorflow.compat.v1 as tf


@dataclasses.dataclass(frozen=True)
class BatchNormParams:
  decay: float = 0.9997
  epsilon: float = 1e-5
  scale: bool = True


@dataclasses.dataclass(frozen=True)
class ConvParams:
  """How a part of the network builds its convolutions.

  Attributes:
    weight_decay: L2 factor for `weights` (slim's l2_regularizer: the loss
      is weight_decay * sum(w**2) / 2). Depthwise weights are regularised
      only when `regularize_depthwise`.
    batch_norm: BN settings, or None for a plain conv with `biases`.
    bn_training: BN uses batch statistics and updates its moving averages
      (the original: is_training and fine_tune_batch_norm).
    activation: applied after BN (or bias); None for linear.
    weights_stddev: stddev of the truncated-normal initializer; None uses
      a variance-scaling (He) initializer.
    regularize_depthwise: also regularise depthwise weights.
    weights_initializer: an explicit initializer for `weights` /
      `depthwise_weights`; overrides weights_stddev (e.g. slim's default
      xavier initializer used by the DeepLab head's plain convs).
  """
  weight_decay: float = 0.0
  batch_norm: Optional[BatchNormParams] = BatchNormParams()
  bn_training: bool = False
  activation: Optional[Callable] = tf.nn.relu
  weights_stddev: Optional[float] = None
  regularize_depthwise: bool = False
  weights_initializer: Optional[Callable] = None

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


_DEFAULT = object()


class Recorder:
  """Collects what a network build creates besides its output tensor."""

  def __init__(self):
    self.regularization_losses: List[tf.Tensor] = []
    # (variable, factor) of each L2 loss factor * sum(w**2) / 2 above.
    self.weight_decays: List[Tuple[tf.Variable, float]] = []
    self.update_ops: List[tf.Operation] = []


_state = threading.local()


def _recorders():
  if not hasattr(_state, 'stack'):
    _state.stack = []
  return _state.stack


@contextlib.contextmanager
def recording():
  """Context in which layers report regularisation losses and BN updates.

  Regularisation losses are reported once per variable, when it is created
  (a second tower reusing the variables adds none), as slim did.

  Yields:
    A `Recorder`.
  """
  rec = Recorder()
  _recorders().append(rec)
  try:
    yield rec
  finally:
    _recorders().pop()


def _record_loss(loss, variable, factor):
  for rec in _recorders():
    rec.regularization_losses.append(loss)
    rec.weight_decays.append((variable, factor))


def _record_update(update):
  # An assign to a resource variable returns a variable-like value, not an
  # Operation: record the assign op itself so callers can group the list.
  op = update if isinstance(update, tf.Operation) else update.op
  for rec in _recorders():
    rec.update_ops.append(op)


def _initializer(params):
  if params.weights_initializer is not None:
    return params.weights_initializer
  if params.weights_stddev is None:
    return tf.variance_scaling_initializer(scale=2.0)
  return tf.truncated_normal_initializer(stddev=params.weights_stddev)


def _regularizer(scale):
  if not scale:
    return None

  # get_variable calls the regularizer twice for one new variable (once to
  # test for None, once for its collection): record the loss only once.
  recorded = []

  def l2(w):
    loss = tf.multiply(scale, tf.nn.l2_loss(w), name='l2_regularizer')
    if not recorded:
      recorded.append(loss)
      _record_loss(loss, w, scale)
    return loss
  return l2


def _weights(name, shape, params, regularize=True):
  return tf.get_variable(
      name, shape=shape, dtype=tf.float32,
      initializer=_initializer(params),
      regularizer=_regularizer(params.weight_decay) if regularize else None,
      trainable=True)


def _compute_dtype(x, var):
  """Casts a variable to the input's dtype (mixed precision keeps fp32 vars)."""
  return var if x.dtype == var.dtype else tf.cast(var, x.dtype)


def _batch_norm_variables(channels, bn):
  """slim's BatchNorm variables: (beta, gamma, moving_mean, moving_variance).

  gamma is a constant 1 when `bn.scale` is off (slim creates no variable).
  """
  beta = tf.get_variable('beta', [channels], tf.float32,
                         tf.zeros_initializer())
  gamma = (tf.get_variable('gamma', [channels], tf.float32,
                           tf.ones_initializer()) if bn.scale
           else tf.ones([channels], tf.float32))
  moving_mean = tf.get_variable(
      'moving_mean', [channels], tf.float32, tf.zeros_initializer(),
      trainable=False)
  moving_variance = tf.get_variable(
      'moving_variance', [channels], tf.float32, tf.ones_initializer(),
      trainable=False)
  return beta, gamma, moving_mean, moving_variance


def batch_norm(x, params: ConvParams, scope='BatchNorm'):
  """slim.batch_norm (fused, with scale) under `scope`.

  In training mode it normalises with the batch moments and records ops that
  move `moving_mean` / `moving_variance` towards them; otherwise it uses the
  moving statistics. gamma and beta are trainable either way.
  """
  bn = params.batch_norm
  channels = x.shape[-1]
  with tf.variable_scope(scope):
    beta, gamma, moving_mean, moving_variance = _batch_norm_variables(
        channels, bn)
    if params.bn_training:
      # fused_batch_norm takes fp32 scale/offset for fp16/bf16 inputs too.
      out, mean, variance = _trained_fused_batch_norm(x, gamma, beta,
                                                      bn.epsilon)
      # 1 - decay in float32 arithmetic, as slim's moving averages compute
      # it (it differs from float32(1 - decay) in the last bits).
      decay = tf.subtract(1.0, tf.constant(bn.decay, tf.float32))
      _record_update(tf.assign_sub(
          moving_mean, (moving_mean - tf.cast(mean, tf.float32)) * decay,
          name='AssignMovingAvg'))
      _record_update(tf.assign_sub(
          moving_variance,
          (moving_variance - tf.cast(variance, tf.float32)) * decay,
          name='AssignMovingAvg_1'))
    else:
      out, _, _ = tf.nn.fused_batch_norm(
          x, gamma, beta, mean=moving_mean, variance=moving_variance,
          epsilon=bn.epsilon, is_training=False)
  return out


# oneDNN's batch norm kernels compiled for AVX-512 take channels in blocks
# of 16. For other counts oneDNN runs, in bfloat16, a generic kernel
# (ONEDNN_VERBOSE: "nspc_bnorm:any" instead of "bnorm_tbb_jit:
# avx512_core_bf16"), and in float32 its AVX2 kernel.
BATCH_NORM_CHANNEL_BLOCK = 16


@contextlib.contextmanager
def batch_norm_channels_padded(enabled=True):
  """Context in which a trained BatchNorm whose channel count is not a
  multiple of BATCH_NORM_CHANNEL_BLOCK runs on its input padded with zero
  channels up to the next multiple, and its output, mean and variance are
  cut back to the real channels (`_trained_fused_batch_norm`).

  Each channel is normalised on its own, so the real channels get the
  same values as without the padding; the padded ones are zeros with zero
  variance, which the BN maps to zeros, and their gradients are zeros.
  On a 2-core Xeon with AMX (`python benchmarks/kernel_choices.py --only
  bn_padded`: a 1x1 convolution, trained BN and ReLU6 with gradients and
  updates, ms, as the op / padded), in bfloat16 mobilenet_v2's
  24-channel projections 18.5 / 2.8 (4x81x81 from 96), 40 channels 4.1 /
  1.3, 200 channels 11.4 / 4.3, xception_65's 728 21.9 / 12.3 (2x41x41);
  in float32 24 channels 4.6 / 4.2, 200 7.4 / 5.5, 728 41.2 / 36.2. In
  a traced mobilenet_v2 OS8 bf16 step (batch 4, crop 321, one inter-op
  thread) the two projections' BN ops took 2.8 ms against 30.4, and the
  step on two cores was 1.03x faster (docs/speed.md).
  Entered by the training towers whose device runs oneDNN's kernels with
  AVX-512: in float32 graphs, and in graphs for grappler's bf16 rewrite
  where those kernels use native bfloat16. Without AVX-512 oneDNN's
  blocks are of 8 channels, which mobilenet_v2's and xception_65's
  counts are multiples of.
  """
  with _setting('bn_channels_padded', enabled):
    yield


def _batch_norm_channel_padding(channels):
  """How many zero channels a trained BN of `channels` channels gets."""
  if not getattr(_state, 'bn_channels_padded', False):
    return 0
  return -channels % BATCH_NORM_CHANNEL_BLOCK


def _trained_fused_batch_norm(x, gamma, beta, epsilon):
  """tf.nn.fused_batch_norm in training mode: (output, batch mean, batch
  variance), on `x` padded with zero channels where
  `batch_norm_channels_padded` asks for it."""
  channels = int(x.shape[-1])
  padding = _batch_norm_channel_padding(channels)
  if not padding:
    return tf.nn.fused_batch_norm(x, gamma, beta, epsilon=epsilon,
                                  is_training=True)[:3]
  with tf.name_scope('padded_channels'):
    x = tf.pad(x, [[0, 0]] * (x.shape.ndims - 1) + [[0, padding]])
    gamma = tf.pad(gamma, [[0, padding]], constant_values=1.0)
    beta = tf.pad(beta, [[0, padding]])
  out, mean, variance = tf.nn.fused_batch_norm(x, gamma, beta,
                                               epsilon=epsilon,
                                               is_training=True)[:3]
  # A Slice (its gradient is a Pad), not a StridedSlice (its gradient op
  # took 3.5 ms in bfloat16 where the Pad took 0.5).
  with tf.name_scope('real_channels'):
    ndims = out.shape.ndims
    return (tf.slice(out, [0] * ndims, [-1] * (ndims - 1) + [channels]),
            mean[:channels], variance[:channels])


@contextlib.contextmanager
def folding_frozen_batch_norm():
  """Context in which a frozen BatchNorm is folded into its convolution.

  Frozen BN (`bn_training` off) is a fixed affine map per output channel,
  gamma / sqrt(moving_variance + epsilon) and an offset: the convolution
  then runs with its weights scaled by it and adds the offset, and the
  gradients of weights, gamma and beta flow through that product. The same
  function and the same variables, with a bias add in place of the BN op
  and its gradient op (an xception_65 training step with frozen BN 1.12x
  faster on a 2-core AVX2 CPU, and its peak memory 13 % lower: the BN
  inputs are no longer kept for the gradient). Used by the training
  towers; inference graphs (eval, vis, export, validation) keep the BN op
  as the original built it.
  """
  with _setting('fold', True):
    yield


@contextlib.contextmanager
def batch_norm_from_input_moments(enabled=True, centred=False):
  """Context in which a trained BatchNorm after a 1x1 convolution that
  widens its input (mobilenet_v2's expansions) takes the batch moments of
  the convolution's output from those of its input, and is folded into
  the convolution (`expanded_batch_norm`).

  Over the pixels X (n x c_in), the output XW has the mean mean(X) W and,
  per channel k, the (biased) variance w_k' cov(X) w_k, with cov(X) a
  c_in x c_in matrix from one small matmul. So the normalised output is
  X (W scale) + offset with scale = gamma / sqrt(variance + epsilon) and
  offset = beta - mean * scale: the same function of X, W, gamma and beta,
  and the same moving-average updates, without a batch norm op and its
  gradient over the output, which has c_out > c_in channels. Its float32
  values are as close to a float64 computation as the BN op's, or closer
  (docs/speed.md). Entered by the training towers of float32 graphs on a
  CPU with oneDNN's kernels, where it was measured, and of graphs for the
  bf16 rewrite where oneDNN runs on AMX tiles and the activations are
  compiled by XLA (`activations_in_xla`).

  With `centred`, the covariance is the product of the centred input with
  itself instead of the product of the input less the mean's: for graphs
  for the bf16 rewrite, which rounds the product to bfloat16, so that an
  input whose mean is large beside its spread keeps its variance (the
  difference of two rounded values would lose it).
  """
  with _setting('bn_input_moments', enabled), \
      _setting('bn_input_moments_centred', enabled and centred):
    yield


@contextlib.contextmanager
def dilated_depthwise_in_one_op(enabled=True):
  """Context in which a dilated depthwise convolution runs as one op.

  TensorFlow builds a dilated (atrous) depthwise convolution as
  space-to-batch, the undilated op, batch-to-space, and the same three in
  its gradient. oneDNN's CPU kernel computes the dilated op itself, faster
  for rates up to 4 (mobilenet_v2 OS8's rates 2 and 4, xception's exit
  flow at OS16), slower for larger ones (ASPP's 6, 12, 18; see
  MAX_ONE_OP_RATE), and the gradient kernels for it ignore the dilation.
  So, for stride 1, 'SAME' padding, an odd kernel, depth multiplier 1,
  float32 (as built: grappler's bf16 rewrite may cast it later) and rates
  up to 4, the forward op is the dilated one, the input
  gradient the same op with the kernel flipped, and the filter gradient
  the space-to-batch form's (the same values, checked by
  tests/test_dilated_depthwise.py).

  Only for ops that run on a CPU with oneDNN's kernels: TensorFlow's own
  kernels refuse the dilated op (CPU) or do not read its dilation (GPU).
  Entered by the training towers, `enabled` by their device
  (towers.runs_on_onednn_cpu), and in graphs built for grappler's bf16
  rewrite only where oneDNN runs on AMX tiles (its bfloat16 op ran on
  TensorFlow's own kernel on an AVX2 CPU; on an AVX512_BF16 CPU without AMX
  it ran, but the bf16 step was slower).
  """
  with _setting('one_op_dilation', enabled):
    yield


# The largest share of a dilated dimension that a band of the banded form
# may cover (`_bands_pay`). In float32 graphs half (twice the rate at least
# the input's size): ASPP's rates 12 and 18 on a 21x21 input (crop 321 at
# output stride 16), rate 18 at 33x33 (crop 513), measured on 2-core AVX2
# CPUs. In graphs for the bf16 rewrite a quarter, where oneDNN runs on AMX
# tiles: alone, with both gradients, space-to-batch / bands, ms, bf16, on
# 2x21x21x2048: rate 18 (bands of 3 of 21 rows) 12.6 / 5.2, but rate 12 (9
# of 21) 5.7 / 9.5; an xception_65 bf16 step 1.02x faster (docs/speed.md).
MAX_BAND = 1 / 2
MAX_BF16_BAND = 1 / 4


@contextlib.contextmanager
def dilated_depthwise_in_bands(enabled=True, max_band=MAX_BAND):
  """Context in which a dilated depthwise convolution whose taps other
  than the centre reach only bands along the input's border, each at most
  `max_band` of the input's height (width), runs as
  dilated_depthwise_by_bands (see _bands_pay): plain TensorFlow ops, the
  same values. Entered by the training towers on a CPU, where it was
  measured: in float32 graphs ASPP's rate-12 and rate-18 branches of an
  xception_65 step at crop 321 (MAX_BAND), in graphs for the bf16 rewrite
  where oneDNN runs on AMX tiles its rate-18 branch (MAX_BF16_BAND).
  """
  with _setting('banded_dilation', max_band if enabled else False):
    yield


# Depthwise layers whose filter gradient `depthwise_filter_gradient_in_
# tensorflow_kernel` computes in TensorFlow's own kernel: input channels
# from MIN_ to below MAX_TF_KERNEL_FILTER_GRADIENT_CHANNELS, and at least
# MIN_TF_KERNEL_FILTER_GRADIENT_PIXELS input pixels (batch x height x
# width). On a 2-core AVX2-only EPYC, two runs of `python
# benchmarks/kernel_choices.py --only depthwise_filter_gradient` (3x3,
# stride 1, the gradient alone), ms for oneDNN's kernel / TensorFlow's:
# 4x161x161x96 28.9 / 28.9 and 30.3 / 19.5, 4x81x81x144 11.0 / 8.8 and
# 11.0 / 8.0, 4x41x41x960 17.0 / 17.5 and 17.3 / 12.6, the same at rate 4
# (after space-to-batch) 32.0 / 26.3 and 36.8 / 26.5, 2x161x161x128 20.2
# / 26.3 and 20.5 / 16.1; TensorFlow's kernel varies more from run to
# run, and is slower for small inputs (2x21x21x728 1.1 / 2.5 and 1.2 /
# 2.6), 1024 channels and more (2x41x41x1024 12.8 / 39.3 and 13.1 /
# 47.8, 2x21x21x2048 4.7 / 15.9) and 32 (4x161x161x32 8.1 / 8.8). In the
# towers' step the gain holds: a traced mobilenet_v2 OS8 step (batch 4,
# crop 321) spent 81.7 ms in its ten dilated layers' filter gradients
# against 167.7 (docs/speed.md).
MIN_TF_KERNEL_FILTER_GRADIENT_CHANNELS = 64
MAX_TF_KERNEL_FILTER_GRADIENT_CHANNELS = 1024
MIN_TF_KERNEL_FILTER_GRADIENT_PIXELS = 2048


@contextlib.contextmanager
def depthwise_filter_gradient_in_tensorflow_kernel(enabled=True):
  """Context in which the filter gradient of a float32 depthwise
  convolution with 64 to 1023 input channels and at least 2048 input
  pixels (as built; the space-to-batch form's undilated op, and the filter
  gradient of `dilated_depthwise_one_op`) runs in TensorFlow's own kernel
  instead of oneDNN's, the same sum in another order.

  TensorFlow hands the op to oneDNN whenever its kernels are on; with the
  padding given as numbers ('EXPLICIT') it keeps its own kernel, which on
  an AVX2-only CPU was faster for those shapes, slower for others
  (MAX_TF_KERNEL_FILTER_GRADIENT_CHANNELS). Entered by the training towers
  of float32 graphs whose device runs oneDNN's kernels without AVX-512
  (cpu.onednn_avx512), the only CPUs where it was measured.
  """
  with _setting('tf_kernel_filter_gradient', enabled):
    yield


def _tf_kernel_filter_gradient_pays(x):
  """Whether a depthwise convolution of x takes its filter gradient from
  TensorFlow's kernel here (`depthwise_filter_gradient_in_tensorflow_
  kernel`)."""
  pixels = x.shape[:-1].num_elements()
  return bool(getattr(_state, 'tf_kernel_filter_gradient', False)
              and x.dtype == tf.float32
              and (MIN_TF_KERNEL_FILTER_GRADIENT_CHANNELS <= int(x.shape[-1])
                   < MAX_TF_KERNEL_FILTER_GRADIENT_CHANNELS)
              and pixels and pixels >= MIN_TF_KERNEL_FILTER_GRADIENT_PIXELS)


_TF_KERNEL_DEPTHWISE_GRADIENT = 'DeeplabDepthwiseTfKernelFilterGradient'


@tf.RegisterGradient(_TF_KERNEL_DEPTHWISE_GRADIENT)
def _depthwise_gradient_tf_kernel_filter(op, grad):
  """The gradients of a DepthwiseConv2dNative op: the input's as
  TensorFlow builds it, the filter's with the padding as numbers
  (`depthwise_filter_gradient_tf_kernel`)."""
  x, w = op.inputs
  attrs = {name: op.get_attr(name) for name in (
      'strides', 'padding', 'explicit_paddings', 'data_format',
      'dilations')}
  dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
      input_sizes=tf.shape(x), filter=w, out_backprop=grad, **attrs)
  return dx, depthwise_filter_gradient_tf_kernel(x, w, grad, attrs)


def depthwise_filter_gradient_tf_kernel(x, w, dy, attrs):
  """The filter gradient of a DepthwiseConv2dNative op with `attrs`
  (strides, padding, explicit_paddings, data_format, dilations) of input
  x, weights w and output gradient dy; for an NHWC op without dilation
  and with known height and width, 'SAME' or 'VALID' given as the numbers
  they stand for, which keeps it in TensorFlow's own CPU kernel."""
  padding, data_format = (
      value.decode() if isinstance(value, bytes) else value
      for value in (attrs['padding'], attrs['data_format']))
  sizes = x.shape[1:3].as_list()
  if (padding in ('SAME', 'VALID') and data_format == 'NHWC'
      and list(attrs['dilations']) == [1, 1, 1, 1] and None not in sizes):
    pads = [0, 0]
    for size, kernel, stride in zip(sizes, w.shape[:2].as_list(),
                                    list(attrs['strides'])[1:3]):
      outputs, before = _strided_extent(size, kernel, stride, padding)
      pads += [before,
               max((outputs - 1) * stride + kernel - size - before, 0)]
    attrs = dict(attrs, padding='EXPLICIT', explicit_paddings=pads + [0, 0])
  return tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
      input=x, filter_sizes=tf.shape(w), out_backprop=dy, **attrs)


def tf_kernel_filter_gradients():
  """Context in which the DepthwiseConv2dNative ops built take their
  filter gradient from depthwise_filter_gradient_tf_kernel."""
  return tf.get_default_graph().gradient_override_map(
      {'DepthwiseConv2dNative': _TF_KERNEL_DEPTHWISE_GRADIENT})


def _tf_kernel_filter_gradients_if(pays):
  """tf_kernel_filter_gradients if `pays` (_tf_kernel_filter_gradient_pays
  of the layer's input), else a context that changes nothing."""
  return tf_kernel_filter_gradients() if pays else contextlib.nullcontext()


@contextlib.contextmanager
def filter_gradient_as_matmul(enabled=True):
  """Context in which a large stride-1 convolution's filter gradient is a
  matmul over the input's patches.

  oneDNN's filter-gradient kernel is slow on an AVX2 CPU for stride-1
  convolutions over large inputs with few channels: the stem convolutions
  of xception_65 (entry_flow/conv1_2) and of the resnet "beta" variants.
  So, for a float32 convolution with stride 1, rate 1, a kernel larger
  than 1x1 and at least MIN_PATCH_GRADIENT_PIXELS pixels per input image,
  the filter gradient is a matmul of the output gradient with the kh*kw*C
  patches of the input (tf.image.extract_patches, in the weights' order),
  summed over bands of output rows (MAX_PATCH_FLOATS); the forward op and
  the input gradient stay oneDNN's (conv2d_filter_gradient_by_patches).

  Only for ops on a CPU with oneDNN's kernels (towers.runs_on_onednn_cpu),
  entered by the training towers as dilated_depthwise_in_one_op is.
  """
  with _setting('patch_filter_gradient', enabled):
    yield


@contextlib.contextmanager
def strided_depthwise_input_gradient_at_stride_1(enabled=True):
  """Context in which a strided depthwise convolution's input gradient is
  computed at stride 1, on the output gradient spread out by the stride
  (strided_depthwise_spread_input_gradient).

  oneDNN's bfloat16 kernel for the input gradient of a strided depthwise
  convolution is many times slower than its float32 one, where its
  stride-1 and forward bfloat16 kernels are as fast or faster: alone, the
  input gradient of mobilenet_v2's first stride-2 layer (4x161x161x96)
  took 49 ms in bf16 against 2 ms in fp32; the layer's forward op and
  both gradients 53 ms in bf16, 8 ms in this form, 6 ms in fp32 (`python
  benchmarks/kernel_choices.py --only strided_depthwise`; Xeon with AMX,
  the same with oneDNN capped at AVX512_CORE_BF16; docs/speed.md).
  Entered by the training towers of graphs built for grappler's bf16
  rewrite on a CPU with oneDNN's kernels; in float32 TensorFlow's kernels
  are faster (12.6 ms in this form).
  """
  with _setting('strided_input_gradient_at_stride_1', enabled):
    yield


@contextlib.contextmanager
def activations_in_xla(enabled=True):
  """Context in which the activations of the layers (`activate`) are
  compiled by XLA, each in a cluster of its own, and so are their
  gradients.

  TensorFlow's CPU kernels for ReLU, ReLU6 and their gradients are several
  times slower in bfloat16 than in float32 (they convert element by
  element); XLA's are 1.3-3.7x faster, with the same values: alone,
  ReLU6 of 4x161x161x96 with its gradient took 11.7 ms in bf16 and 3.2
  ms compiled (`python benchmarks/kernel_choices.py --only activations`,
  Xeon with AMX; docs/speed.md). In float32 XLA's were slower, and so was
  the step. Entered by the training towers of graphs built for
  grappler's bf16 rewrite on a CPU with oneDNN's kernels, unless the whole
  network is compiled (--use_xla), whose one cluster these would split.
  """
  with _setting('xla_activation', enabled):
    yield


@contextlib.contextmanager
def broadcast_input_projected_once(enabled=True):
  """Context in which a 1x1 convolution of a concatenation whose first part
  is one value per image, repeated at every pixel, multiplies that part by
  its rows of the weights once per image instead of at every pixel
  (`pointwise_conv2d_of_broadcast_and`). ASPP's concat_projection takes
  this form where the image pooling branch pools the whole feature map
  (a crop's training features), whose resize back to the feature size
  only repeats the pooled value.

  The same function of the same variables: the product of a concatenation
  is the sum of each part's product with its rows of the weights, and a
  repeated value's product is the same at every pixel. For mobilenet_v2
  OS8 at crop 321 (41x41 features, 512 channels into concat_projection,
  half of them the image pooling branch's) this halves concat_projection's
  products (a training step of batch 4 counted 92.1 GFLOP before, 89.5
  after, by `deeplab-bench`) and drops the concatenation, its gradient's
  slices and the resize with its gradient: 1.02x a step on an AVX2-only
  CPU (docs/speed.md). For xception_65 OS16 (five branches at 21x21) it
  saves a fifth of a small layer. Entered by the training towers, on every
  device; inference graphs keep the original's ops.
  """
  with _setting('broadcast_projected_once', enabled):
    yield


def projects_broadcast_input_once():
  """Whether `broadcast_input_projected_once` is in effect."""
  return getattr(_state, 'broadcast_projected_once', False)


def activate(activation, x):
  """activation(x); in an XLA cluster inside `activations_in_xla`."""
  if not getattr(_state, 'xla_activation', False):
    return activation(x)
  with _compiled_by_xla():
    return activation(x)


def _compiled_by_xla():
  """Context whose ops XLA compiles in one cluster, and the gradients
  built for them in another."""
  return tf.xla.experimental.jit_scope(compile_ops=True,
                                       separate_compiled_gradients=True)


@contextlib.contextmanager
def _setting(name, value):
  before = getattr(_state, name, False)
  setattr(_state, name, value)
  try:
    yield
  finally:
    setattr(_state, name, before)


def _fold_batch_norm(w, params, normalize, depthwise=False,
                     scope='BatchNorm'):
  """(weights, offset) of a layer whose frozen BN under `scope` is folded
  into it: w scaled per output channel, and the offset to add after the
  convolution. (w, None) when BN is not folded here (no BN, trained BN, or
  outside `folding_frozen_batch_norm`).

  The output channels are w's last dimension, or for depthwise weights
  [kh, kw, in, multiplier] the in x multiplier pairs.
  """
  if not (normalize and params.batch_norm is not None
          and not params.bn_training and getattr(_state, 'fold', False)):
    return w, None
  bn = params.batch_norm
  out_shape = w.shape[-2:] if depthwise else w.shape[-1:]
  channels = int(out_shape.num_elements())
  with tf.variable_scope(scope):
    beta, gamma, moving_mean, moving_variance = _batch_norm_variables(
        channels, bn)
    scale = gamma * tf.rsqrt(moving_variance + bn.epsilon)
    offset = beta - moving_mean * scale
  return w * tf.reshape(scale, out_shape), offset


_FOLDED_OFFSET_GRADIENT = 'DeeplabFoldedOffsetAdd'


@tf.RegisterGradient(_FOLDED_OFFSET_GRADIENT)
def _folded_offset_add_gradient(op, grad):
  """Gradient of x + offset (offset: the channels): the offset's is the
  column sums of the output gradient, as a product with a row of ones.

  TensorFlow's gradient of the add sums over batch, rows and columns with
  a reduction that took 1.5-3.5x as long alone on the CPU as the product
  (fp32, 2x161x161x128: 2.6 against 0.74 ms; 4x41x41x576: 1.6 against 0.67
  ms). A training step of xception_65 with BN frozen, Xeon with AMX, 1.02x
  faster in fp32 and 1.03x in bf16 (docs/speed.md).
  """
  del op
  return grad, _channel_sums(grad)


def _channel_sums(t):
  """The sums of t over all but its last dimension (the channels), as
  the product of its rows with a row of ones (see
  _folded_offset_add_gradient)."""
  channels = int(t.shape[-1])
  rows = tf.reshape(t, [-1, channels])
  ones = tf.ones([1, _leading_size(rows)], t.dtype)
  return tf.reshape(tf.matmul(ones, rows), [channels])


def _finish(x, params, activation, use_bias, num_outputs, normalize,
            folded_offset=None):
  if folded_offset is not None:
    # An add, not a BiasAdd: with BiasAdd, grappler's remapper failed on
    # the xception_65 frozen-BN training graph ("remapper failed: ...
    # Mutation::Apply error" naming its residual adds) and so dropped every
    # remapper fusion of the graph (tests/test_batch_norm_folding.py).
    with tf.get_default_graph().gradient_override_map(
        {'AddV2': _FOLDED_OFFSET_GRADIENT}):
      x = tf.add(x, _compute_dtype(x, folded_offset))
  elif normalize and params.batch_norm is not None:
    x = batch_norm(x, params)
  elif use_bias:
    biases = tf.get_variable('biases', [num_outputs], tf.float32,
                             tf.zeros_initializer())
    x = tf.nn.bias_add(x, _compute_dtype(x, biases))
  act = params.activation if activation is _DEFAULT else activation
  if act is not None:
    x = activate(act, x)
  return x


def conv2d(x, num_outputs, kernel_size, params: ConvParams, scope,
           stride=1, rate=1, padding='SAME', activation=_DEFAULT,
           normalize=True, use_bias=True):
  """slim.conv2d: `weights`, then BatchNorm (or `biases`), then activation.

  Args:
    x: NHWC input.
    num_outputs: output channels.
    kernel_size: int or (kh, kw).
    params: the part's ConvParams.
    scope: variable scope name (e.g. 'aspp0').
    stride, rate: stride and atrous rate (not both > 1).
    padding: 'SAME' or 'VALID'.
    activation: overrides params.activation (None for linear).
    normalize: False skips BN even when params has it (then `biases`).
    use_bias: without BN, whether to add `biases`.

  Returns:
    The output tensor.
  """
  kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
  with tf.variable_scope(scope):
    w = _weights('weights', [kh, kw, x.shape[-1], num_outputs], params)
    if (getattr(_state, 'bn_input_moments', False) and (kh, kw) == (1, 1)
        and stride == 1 and normalize and params.batch_norm is not None
        and params.bn_training and x.dtype == tf.float32
        and _input_moments_pay(int(x.shape[-1]), num_outputs)):
      return expanded_batch_norm(x, w, params, activation)
    w, offset = _fold_batch_norm(w, params, normalize)
    if (kh, kw) == (1, 1) and stride == 1:
      y = _pointwise(x, _compute_dtype(x, w))
    elif (getattr(_state, 'patch_filter_gradient', False) and stride == 1
          and rate == 1 and x.dtype == tf.float32
          and ((x.shape[1:3].num_elements() or 0)
               >= MIN_PATCH_GRADIENT_PIXELS)):
      y = conv2d_filter_gradient_by_patches(x, w, padding)
    elif rate > 1 and stride == 1:
      # Atrous through space-to-batch, as the original's layers built it:
      # Conv2D's own dilations have no CPU gradient kernels without oneDNN
      # ("CPU implementations do not yet support dilation rates larger
      # than 1"), and this runs on every device.
      y = tf.nn.atrous_conv2d(x, _compute_dtype(x, w), rate, padding,
                              name='Conv2D')
    else:
      y = tf.nn.conv2d(x, _compute_dtype(x, w),
                       strides=[1, stride, stride, 1], padding=padding,
                       dilations=[1, rate, rate, 1])
    return _finish(y, params, activation, use_bias, num_outputs, normalize,
                   offset)


# The smallest input (height x width) whose filter gradient
# `filter_gradient_as_matmul` computes from patches. On 2-core AVX2 CPUs,
# ms for oneDNN's kernel / the patches and a matmul (batch 2, 3x3; `python
# benchmarks/kernel_choices.py --only filter_gradient`, three runs on two
# machines): 161x161, 32 to 64 channels 74.5 / 45.3, 40.6 / 28.7, 29.2 /
# 26.0; 64 to 128 331 / 109, 115 / 75.5, 122 / 75.1; but 129x129x64 29.5 /
# 33.4 and 35.2 / 33.4, 81x81x64 26.1 / 20.6, 12.7 / 13.8, 9.8 / 13.5 and
# 11.0 / 13.6, and smaller inputs slower from patches in most runs. So the
# stems of crop 321 and larger (161x161 and up) take the patches form.
MIN_PATCH_GRADIENT_PIXELS = 161 * 161


# The patches of a 161x161 input are large (2x161x161x576 floats, 119 MB,
# for a resnet "beta" stem's conv1_3): formed at once they raised the peak
# RSS of a resnet_v1_50_beta training process by 0.1-0.4 GB. So they are
# formed in bands of output rows of at most this many floats (32 MB), one
# band after the other.
MAX_PATCH_FLOATS = 8 * 1024 * 1024


def conv2d_filter_gradient_by_patches(x, w, padding):
  """tf.nn.conv2d with stride 1 whose filter gradient is a matmul of the
  output gradient with x's patches (`filter_gradient_as_matmul`)."""
  strides = [1, 1, 1, 1]

  @tf.custom_gradient
  def conv(x, w):
    def grad(dy):
      dx = tf.nn.conv2d_backprop_input(tf.shape(x), w, dy, strides, padding)
      return dx, _filter_gradient_by_patches(x, dy, w.shape, padding)
    return tf.nn.conv2d(x, w, strides, padding), grad

  return conv(x, w)


def _filter_gradient_by_patches(x, dy, w_shape, padding):
  """The filter gradient of a stride-1 convolution: the sum over output
  pixels of dy times the input's patch there, over bands of output rows of
  at most MAX_PATCH_FLOATS patch values, formed one after the other."""
  kh, kw, channels, num_outputs = w_shape.as_list()
  if padding == 'SAME':
    top, left = (kh - 1) // 2, (kw - 1) // 2
    x = tf.pad(x, [[0, 0], [top, kh - 1 - top], [left, kw - 1 - left],
                   [0, 0]])
  patch_size = kh * kw * channels
  batch, rows, cols = dy.shape.as_list()[:3]
  bands = [None]  # None: all rows (also where the size is not known)
  if None not in (batch, rows, cols):
    band = max(1, MAX_PATCH_FLOATS // (batch * cols * patch_size))
    if band < rows:
      bands = [(start, start + band) for start in range(0, rows, band)]
  dw = None
  for rows_of_band in bands:
    # A band's patches are formed after the previous band's product.
    with tf.control_dependencies([dw] if dw is not None else []):
      x_band, dy_band = x, dy
      if rows_of_band is not None:
        start, stop = rows_of_band
        x_band, dy_band = x[:, start:stop + kh - 1], dy[:, start:stop]
      patches = tf.image.extract_patches(
          x_band, [1, kh, kw, 1], [1, 1, 1, 1], [1, 1, 1, 1], 'VALID')
    # dy^T patches, transposed: a little faster than patches^T dy for
    # xception_65's conv1_2 (48 against 53 ms).
    product = tf.matmul(tf.reshape(dy_band, [-1, num_outputs]),
                        tf.reshape(patches, [-1, patch_size]),
                        transpose_a=True)
    dw = product if dw is None else dw + product
  return tf.reshape(tf.transpose(dw), w_shape)


def _to_pixels_of(rows, x, channels, name=None):
  """rows [pixels of x, channels] reshaped to x's shape with `channels`
  as its last dimension: to a constant shape where x's size is known when
  the graph is built (a training crop), else to one computed from x's
  (eight ops against one constant, per layer)."""
  if x.shape.is_fully_defined():
    shape = x.shape[:-1].as_list() + [channels]
  else:
    shape = tf.concat([tf.shape(x)[:-1], [channels]], 0)
  y = tf.reshape(rows, shape, name=name)
  y.set_shape(x.shape[:-1].concatenate([channels]))
  return y


def _leading_size(t):
  """t's first dimension: an int where known when the graph is built,
  else a scalar tensor."""
  size = tf.compat.dimension_value(t.shape[0])
  return size if size is not None else tf.shape(t)[0]


def _pointwise(x, w, name='Conv2D'):
  """A 1x1 stride-1 convolution as one matmul over all pixels.

  The same product; on the CPU, MatMul's gradients run faster than
  Conv2DBackpropFilter/Input (a training step of mobilenet_v2 OS8 1.09x,
  xception_65 1.07x faster in fp32; bf16 unchanged). The output tensor keeps
  the convolution's name, `<scope>/Conv2D:0`; the input goes in through
  `<scope>/pixels`.
  """
  channels, num_outputs = int(w.shape[2]), int(w.shape[3])
  y = tf.matmul(tf.reshape(x, [-1, channels], name='pixels'),
                tf.reshape(w, [channels, num_outputs]))
  return _to_pixels_of(y, x, num_outputs, name=name)


def pointwise_conv2d_of_broadcast_and(per_image, x, num_outputs,
                                      params: ConvParams, scope,
                                      activation=_DEFAULT):
  """conv2d(tf.concat([per_image repeated at each pixel of x, x], 3),
  num_outputs, 1, params, scope, activation=activation), with the same
  variables and output, per_image ([batch, 1, 1, c]) multiplied by its rows
  of the weights once per image (`broadcast_input_projected_once`).

  The output before BN keeps conv2d's name, `<scope>/Conv2D:0`. BN is the
  BN op or, inside `folding_frozen_batch_norm`, folded; never the moments
  form of `expanded_batch_norm`, which only widening convolutions take and
  this one has more inputs than outputs wherever the model builds it
  (ASPP's branches each have as many channels as the projection).
  """
  shared, channels = int(per_image.shape[-1]), int(x.shape[-1])
  if num_outputs > shared + channels:
    raise ValueError('pointwise_conv2d_of_broadcast_and widens %d channels '
                     'to %d; use conv2d on the concatenation' % (
                         shared + channels, num_outputs))
  with tf.variable_scope(scope):
    w = _weights('weights', [1, 1, shared + channels, num_outputs], params)
    w, offset = _fold_batch_norm(w, params, normalize=True)
    w = _compute_dtype(x, w)
    per_pixel = _pointwise(x, w[:, :, shared:], name='per_pixel')
    once = tf.matmul(tf.reshape(per_image, [-1, shared]),
                     tf.reshape(w[:, :, :shared], [shared, num_outputs]))
    y = tf.add(per_pixel, tf.reshape(once, [-1, 1, 1, num_outputs]),
               name='Conv2D')
    return _finish(y, params, activation, True, num_outputs, True, offset)


# The input's moments cost c_in x c_in products per pixel (forward and
# gradient), the BN op passes over c_out channels: alone, a 1x1
# convolution with trained BN and ReLU6 and its gradients took, in ms, BN op
# / moments from the input (Xeon with AMX, fp32): 4x161x161, 16 to 96
# channels 24.9 / 12.9; 4x41x41, 160 to 960 30.4 / 25.7; 2x41x41, 128 to
# 512 7.6 / 6.8; 2x161x161, 64 to 128 22.3 / 20.1; but 2x81x81, 128 to 256
# 14.3 / 15.6 and 2x21x21, 256 to 1024 6.4 / 8.7. So the moments come from
# the input where c_in * c_in is at most this many times c_out. The same
# holds on an AVX2-only first-generation Zen EPYC (benchmarks/
# kernel_choices.py --only bn_moments; docs/speed.md).
MAX_INPUT_MOMENT_RATIO = 32


def _input_moments_pay(channels, num_outputs):
  """Whether `expanded_batch_norm` is used for a 1x1 convolution from
  `channels` to `num_outputs` channels (see MAX_INPUT_MOMENT_RATIO)."""
  return (num_outputs > channels
          and channels * channels <= MAX_INPUT_MOMENT_RATIO * num_outputs)


def expanded_batch_norm(x, w, params: ConvParams, activation=_DEFAULT,
                        scope='BatchNorm'):
  """A 1x1 stride-1 convolution of x with w [1, 1, c_in, c_out] followed
  by a trained BatchNorm under `scope` and the activation, with the batch
  moments of the output computed from the input's (see
  `batch_norm_from_input_moments`). The same variables and moving-average
  updates as conv2d then batch_norm.
  """
  bn = params.batch_norm
  channels, num_outputs = int(w.shape[2]), int(w.shape[3])
  pixels = tf.reshape(x, [-1, channels], name='pixels')
  weights = tf.reshape(w, [channels, num_outputs])
  count = tf.cast(_leading_size(pixels), tf.float32)
  with tf.variable_scope(scope):
    beta, gamma, moving_mean, moving_variance = _batch_norm_variables(
        num_outputs, bn)
    input_mean = tf.reduce_mean(pixels, 0)
    if getattr(_state, 'bn_input_moments_centred', False):
      centred = tf.subtract(pixels, input_mean, name='centred')
      covariance = _gram(centred) / count
    else:
      covariance = (_gram(pixels) / count
                    - input_mean[:, None] * input_mean[None, :])
    mean = tf.linalg.matvec(weights, input_mean, transpose_a=True)
    # Rounding can take a variance of (nearly) 0 below it.
    variance = tf.maximum(
        tf.reduce_sum(weights * tf.matmul(covariance, weights), 0), 0.0)
    scale = gamma * tf.rsqrt(variance + bn.epsilon)
    offset = beta - mean * scale
    # The moving variance moves towards the unbiased batch variance, as
    # with the BN op.
    unbiased = variance * count / tf.maximum(count - 1.0, 1.0)
    decay = tf.subtract(1.0, tf.constant(bn.decay, tf.float32))
    _record_update(tf.assign_sub(
        moving_mean, (moving_mean - mean) * decay, name='AssignMovingAvg'))
    _record_update(tf.assign_sub(
        moving_variance, (moving_variance - unbiased) * decay,
        name='AssignMovingAvg_1'))
  y = tf.matmul(pixels, weights * scale)
  act = params.activation if activation is _DEFAULT else activation
  # Where activations are compiled by XLA (graphs for the bf16 rewrite),
  # the offset joins the activation's cluster, on the 4-D output: on the
  # matmul's 2-D one grappler fuses the add and the activation into the
  # matmul, which in bfloat16 then took about 4x the plain matmul's time
  # (mobilenet_v2's 4x41x41x160 to 960: 8.2 against 1.9 ms).
  in_xla = (getattr(_state, 'xla_activation', False)
            and act in _GRADIENT_FROM_OUTPUT)
  if not in_xla:
    y = tf.nn.bias_add(y, offset)
    if act is not None:
      # On the matmul's 2-D output, where grappler fuses the bias add and
      # the activation into the matmul.
      y = activate(act, y)
  y = _to_pixels_of(y, x, num_outputs)
  if in_xla:
    y = offset_and_activation_in_xla(y, offset, act)
  return y


# Activations whose gradient op takes their output: the gradient of
# activation(y + offset) needs neither y nor the sum kept.
_GRADIENT_FROM_OUTPUT = {
    tf.nn.relu: tf.raw_ops.ReluGrad,
    tf.nn.relu6: tf.raw_ops.Relu6Grad,
}


def offset_and_activation_in_xla(y, offset, activation):
  """activation(y + offset), offset one value per channel (y's last
  dimension), activation tf.nn.relu or tf.nn.relu6: the add and the
  activation compiled by XLA in one cluster, the activation's gradient in
  another. The offset's gradient is the column sums of that gradient as a
  product with a row of ones: an XLA reduction over the pixels was many
  times slower than oneDNN's kernels on the CPU, and so is TensorFlow's
  bfloat16 one (a BiasAddGrad or Sum).
  """
  grad_op = _GRADIENT_FROM_OUTPUT[activation]

  @tf.custom_gradient
  def offset_activation(y, offset):
    with _compiled_by_xla():
      z = activation(y + offset)

    def grad(dz):
      with _compiled_by_xla():
        dy = grad_op(gradients=dz, features=z)
      return dy, _channel_sums(dy)

    return z, grad

  return offset_activation(y, offset)


def _gram(x):
  """x' x for a matrix x (n x c), with the gradient x (g + g') as one
  matmul: TensorFlow's gradient of tf.matmul(x, x, transpose_a=True) is
  two matmuls of x, one for each operand, each as large as the forward
  product (n c^2 multiply-adds)."""

  @tf.custom_gradient
  def gram(x):
    def grad(g):
      return tf.matmul(x, g + tf.transpose(g))
    return tf.matmul(x, x, transpose_a=True), grad

  return gram(x)


def depthwise_conv2d(x, kernel_size, params: ConvParams, scope,
                     depth_multiplier=1, stride=1, rate=1, padding='SAME',
                     activation=_DEFAULT, normalize=True, use_bias=True):
  """slim.separable_conv2d with num_outputs=None: `depthwise_weights` only.

  `kernel_size` and `rate` are an int or a (height, width) pair. The
  depthwise weights are not L2-regularised unless
  `params.regularize_depthwise`, as in the original.
  """
  kh, kw = _pair(kernel_size)
  channels = int(x.shape[-1])
  with tf.variable_scope(scope):
    w = _weights('depthwise_weights', [kh, kw, channels, depth_multiplier],
                 params, regularize=params.regularize_depthwise)
    w, offset = _fold_batch_norm(w, params, normalize, depthwise=True)
    rates = _pair(rate)
    # The cases the one-op and banded forms cover.
    same_odd_fp32 = (stride == 1 and padding == 'SAME' and kh % 2 and kw % 2
                     and depth_multiplier == 1 and x.dtype == tf.float32)
    if (getattr(_state, 'one_op_dilation', False) and same_odd_fp32
        and 1 < max(rates) <= MAX_ONE_OP_RATE):
      y = dilated_depthwise_one_op(x, w, rates)
    elif (getattr(_state, 'strided_input_gradient_at_stride_1', False)
          and stride > 1 and depth_multiplier == 1 and max(rates) == 1
          and None not in x.shape[1:3].as_list()):
      y = strided_depthwise_spread_input_gradient(
          x, _compute_dtype(x, w), stride, padding)
    elif (getattr(_state, 'banded_dilation', False) and same_odd_fp32
          and _bands_pay(x.shape, rates, _state.banded_dilation)):
      y = dilated_depthwise_by_bands(x, w, rates)
    else:
      with _tf_kernel_filter_gradients_if(_tf_kernel_filter_gradient_pays(x)):
        y = tf.nn.depthwise_conv2d(
            x, _compute_dtype(x, w), strides=[1, stride, stride, 1],
            padding=padding, dilations=list(rates))
    return _finish(y, params, activation, use_bias,
                   channels * depth_multiplier, normalize, offset)


# The largest atrous rate `dilated_depthwise_in_one_op` computes in one op:
# on a 2-core AVX2 CPU, a 3x3 depthwise convolution with both gradients took
# 0.7-0.8x the space-to-batch form's time at rate 2 or 4, 2-5.7x at rates 6
# to 18 (4x41x41x384: rate 2 19 against 27 ms, rate 6 81 against 21 ms;
# benchmarks/kernel_choices.py --only atrous).
MAX_ONE_OP_RATE = 4


def dilated_depthwise_one_op(x, w, rates):
  """The dilated depthwise convolution of `dilated_depthwise_in_one_op`
  ('SAME', stride 1, odd kernel, depth multiplier 1; oneDNN CPU only)."""
  dilations = [1, rates[0], rates[1], 1]
  strides = [1, 1, 1, 1]
  # Read now: the gradient is built later, outside the layer's contexts.
  tf_kernel = _tf_kernel_filter_gradient_pays(x)

  @tf.custom_gradient
  def conv(x, w):
    def grad(dy):
      # 'SAME' with an odd kernel pads symmetrically: the input gradient is
      # the correlation of dy with the kernel flipped in space.
      dx = tf.nn.depthwise_conv2d_native(
          dy, tf.reverse(w, [0, 1]), strides, 'SAME', dilations=dilations)
      with _tf_kernel_filter_gradients_if(tf_kernel):
        dw = tf.gradients(
            tf.nn.depthwise_conv2d(x, w, strides, 'SAME',
                                   dilations=list(rates)), w, dy)[0]
      return dx, dw
    return tf.nn.depthwise_conv2d_native(
        x, w, strides, 'SAME', dilations=dilations), grad

  return conv(x, w)


def _strided_extent(size, kernel, stride, padding):
  """(outputs, padding before) of one dimension of a strided convolution
  with 'SAME' or 'VALID' padding."""
  if padding == 'VALID':
    return (size - kernel) // stride + 1, 0
  outputs = -(-size // stride)
  return outputs, max((outputs - 1) * stride + kernel - size, 0) // 2


def _pad_or_crop(x, rows, cols):
  """x padded with zeros by (before, after) rows and columns; a negative
  `after` drops that many from the end instead."""
  (top, bottom), (left, right) = rows, cols
  x = tf.pad(x, [[0, 0], [top, max(bottom, 0)], [left, max(right, 0)],
                 [0, 0]])
  if bottom < 0 or right < 0:
    x = x[:, :int(x.shape[1]) + min(bottom, 0),
          :int(x.shape[2]) + min(right, 0)]
  return x


def _spread(dy, stride):
  """dy with stride - 1 zeros after each of its rows and columns: what a
  stride-1 convolution sees of a strided one's output gradient."""
  rows, cols, channels = [int(d) for d in dy.shape[1:]]
  y = tf.reshape(dy, [-1, rows, 1, cols, 1, channels])
  y = tf.pad(y, [[0, 0], [0, 0], [0, stride - 1], [0, 0], [0, stride - 1],
                 [0, 0]])
  return tf.reshape(y, [-1, rows * stride, cols * stride, channels])


def strided_depthwise_spread_input_gradient(x, w, stride, padding):
  """A strided depthwise convolution (depth multiplier 1, no dilation,
  'SAME' or 'VALID', known height and width) whose input gradient runs at
  stride 1 (`strided_depthwise_input_gradient_at_stride_1`).

  Output o reads input o * stride + t - before through tap t, so with u
  the output gradient spread by the stride (`_spread`) the input gradient
  is the stride-1 correlation of u, padded by kernel - 1 - before, with the
  kernel flipped in space. The forward op and the filter gradient are
  TensorFlow's; tests/test_dilated_depthwise.py compares the gradients
  with TensorFlow's.
  """
  kh, kw = int(w.shape[0]), int(w.shape[1])
  height, width = int(x.shape[1]), int(x.shape[2])
  out_h, top = _strided_extent(height, kh, stride, padding)
  out_w, left = _strided_extent(width, kw, stride, padding)
  strides = [1, stride, stride, 1]

  @tf.custom_gradient
  def conv(x, w):
    def grad(dy):
      u = _pad_or_crop(_spread(dy, stride),
                       (kh - 1 - top, height + top - out_h * stride),
                       (kw - 1 - left, width + left - out_w * stride))
      dx = tf.nn.depthwise_conv2d_native(u, tf.reverse(w, [0, 1]),
                                         [1, 1, 1, 1], 'VALID')
      dw = tf.nn.depthwise_conv2d_native_backprop_filter(
          x, tf.shape(w), dy, strides, padding)
      return dx, dw
    return tf.nn.depthwise_conv2d_native(x, w, strides, padding), grad

  return conv(x, w)


def _bands_pay(shape, rates, max_band=MAX_BAND):
  """Whether dilated_depthwise_by_bands is used for an NHWC input `shape`
  at `rates`: where every tap but the centre one reaches only a band along
  the border of at most `max_band` of the input's size
  in each dilated dimension (size - rate output positions), which the
  space-to-batch form pays for with an input padded up to twelve times
  larger.
  """
  height, width = shape[1], shape[2]
  if height is None or width is None or max(rates) <= 1:
    return False
  return all(rate == 1 or size - rate <= max_band * size
             for rate, size in zip(rates, (int(height), int(width))))


def _tap_bands(size, kernel, rate):
  """The output positions 0..size-1 of one dimension in bands
  [(start, end, [(tap, offset), ...])]: within a band the same taps of a
  'SAME' stride-1 kernel of `kernel` taps at `rate` read inside the input
  (input position = output position + offset)."""
  taps = _tap_windows(kernel, rate, size)
  edges = sorted({0, size} | {e for t in taps for e in t[2:]})
  return [(a, b, [(tap, offset) for tap, offset, start, end in taps
                  if start <= a and b <= end])
          for a, b in zip(edges, edges[1:])]


def _banded_correlation(x, w, rows, cols):
  """'SAME' stride-1 depthwise correlation of x with w [kh, kw, C, 1],
  assembled band by band from products of shifted windows."""
  out_rows = []
  for r0, r1, row_taps in rows:
    pieces = []
    for c0, c1, col_taps in cols:
      pieces.append(tf.add_n([
          x[:, r0 + oh:r1 + oh, c0 + ow:c1 + ow, :] * w[th, tw, :, 0]
          for th, oh in row_taps for tw, ow in col_taps]))
    out_rows.append(pieces[0] if len(pieces) == 1
                    else tf.concat(pieces, axis=2))
  return out_rows[0] if len(out_rows) == 1 else tf.concat(out_rows, axis=1)


def dilated_depthwise_by_bands(x, w, rates):
  """A dilated depthwise convolution ('SAME', stride 1, odd kernel, depth
  multiplier 1, known height and width) as products of shifted windows of
  the input, band by band: where a tap falls outside the input for part of
  the output, that part is computed without it, instead of on the zeros
  the space-to-batch form pads the input with. The input gradient is the
  same with the kernel flipped in space; the filter gradient of each tap
  sums the products of the output gradient with the input window the tap
  reads. Used by the training towers on a CPU (`banded_dilation`) where
  `_bands_pay`; tests/test_dilated_depthwise.py compares it with
  tf.nn.depthwise_conv2d.
  """
  kh, kw = int(w.shape[0]), int(w.shape[1])
  height, width = int(x.shape[1]), int(x.shape[2])
  rows = _tap_bands(height, kh, rates[0])
  cols = _tap_bands(width, kw, rates[1])

  @tf.custom_gradient
  def conv(x, w):
    def grad(dy):
      dx = _banded_correlation(dy, tf.reverse(w, [0, 1]), rows, cols)
      taps = {}
      for th, oh, r0, r1 in _tap_windows(kh, rates[0], height):
        for tw, ow, c0, c1 in _tap_windows(kw, rates[1], width):
          taps[th, tw] = tf.reduce_sum(
              dy[:, r0:r1, c0:c1, :]
              * x[:, r0 + oh:r1 + oh, c0 + ow:c1 + ow, :], [0, 1, 2])
      zero = tf.zeros_like(w[0, 0, :, 0])  # a tap that never reads inside
      filter_grad = tf.stack([
          tf.stack([taps.get((i, j), zero) for j in range(kw)])
          for i in range(kh)])
      return dx, tf.expand_dims(filter_grad, -1)
    return _banded_correlation(x, w, rows, cols), grad

  return conv(x, w)


def _tap_windows(kernel, rate, size):
  """(tap, offset, start, end) of each tap of one dimension that reads
  inside the input for the outputs start..end-1."""
  out = []
  for tap in range(kernel):
    offset = (tap - (kernel - 1) // 2) * rate
    start, end = max(0, -offset), min(size, size - offset)
    if start < end:
      out.append((tap, offset, start, end))
  return out


# The original's hard sigmoid multiplies by this rounded 1/6.
HARD_SIGMOID_SCALE = 0.16667


def hard_sigmoid(x):
  """The original's hard sigmoid, relu6(x + 3) * 0.16667: the gate of
  MobileNetV3's squeeze-and-excitation and of the head's image pooling."""
  return tf.nn.relu6(x + 3.0) * HARD_SIGMOID_SCALE


def _pair(value):
  """(value, value) for an int, else the (height, width) pair itself."""
  return (value, value) if isinstance(value, int) else tuple(value)


def separable_conv2d(x, num_outputs, kernel_size, params: ConvParams, scope,
                     stride=1):
  """slim's separable_conv2d: depthwise then pointwise in one scope.

  Variables `{scope}/depthwise_weights` [k, k, in, 1] and
  `{scope}/pointwise_weights` [1, 1, in, num_outputs]; no bias, no
  normalisation, no activation (the NAS cells'). A strided conv pads
  explicitly (`fixed_padding`), so its output is aligned with the stride-1
  output subsampled.
  """
  channels = int(x.shape[-1])
  padding = 'SAME'
  if stride > 1:
    x = fixed_padding(x, kernel_size)
    padding = 'VALID'
  with tf.variable_scope(scope):
    depthwise = _weights('depthwise_weights',
                         [kernel_size, kernel_size, channels, 1], params,
                         regularize=params.regularize_depthwise)
    pointwise = _weights('pointwise_weights', [1, 1, channels, num_outputs],
                         params)
    return tf.nn.separable_conv2d(
        x, _compute_dtype(x, depthwise), _compute_dtype(x, pointwise),
        strides=[1, stride, stride, 1], padding=padding)


def split_separable_conv2d(x, num_outputs, params: ConvParams, scope,
                           kernel_size=3, rate=1, depthwise_params=None):
  """DeepLab's separable conv: `{scope}_depthwise` then `{scope}_pointwise`.

  Both are siblings in the current variable scope (not nested under
  `scope/`), each with its own BatchNorm and activation.
  """
  x = depthwise_conv2d(x, kernel_size, depthwise_params or params,
                       scope + '_depthwise', rate=rate)
  return conv2d(x, num_outputs, 1, params, scope + '_pointwise')


def fixed_padding(x, kernel_size, rate=1):
  """Pads H and W so a VALID strided conv sees the input as SAME would at
  stride 1, independently of the input size (xception and resnet)."""
  effective = kernel_size + (kernel_size - 1) * (rate - 1)
  total = effective - 1
  beg = total // 2
  end = total - beg
  return tf.pad(x, [[0, 0], [beg, end], [beg, end], [0, 0]])
