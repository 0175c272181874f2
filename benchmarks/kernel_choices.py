#!/usr/bin/env python3
"""Alternative ways to compute a few of a training step's ops, timed alone.

    python benchmarks/kernel_choices.py [--only matmul,conv1x1,reduce,
                                               atrous,filter_gradient,
                                               depthwise_filter_gradient,
                                               strided_depthwise,
                                               bn_moments, bn_padded,
                                               activations, weight_decay]
                                        [--repeats 15] [--threads 2]

Measures, on this machine and with the settings of the deeplab-* commands
(oneDNN kernels, the BFC allocator), the candidates that docs/speed.md
weighs before changing how the model builds an op:

- matmul: GFLOP/s of the three products of a 1x1 convolution (forward,
  input gradient, weight gradient) for shapes of mobilenet_v2 OS8 (batch 4)
  and xception_65 OS16 (batch 2) at crop 321, and for channel counts near
  xception's 728 (is a shape slow because of its width?);
- conv1x1: a 1x1 convolution with both gradients as the towers build it
  (a matmul of the pixels by the weights) and as TensorFlow's Conv2D, in
  float32 and in bfloat16 (oneDNN's kernels of either may be faster for
  a dtype), ms and GFLOP/s, for shapes of xception_65 OS16 (batch 2) and
  mobilenet_v2 OS8 (batch 4) at crop 321;
- reduce: the gradient of a per-channel offset added to an NHWC tensor
  (what a folded frozen BN's beta receives): tf.reduce_sum over N, H, W,
  BiasAddGrad, and a matmul with a row of ones;
- atrous: a dilated 3x3 depthwise convolution with its two gradients, as
  TensorFlow builds it (space-to-batch around the depthwise op), as one
  dilated op (layers.dilated_depthwise_one_op, what the training towers
  use on a oneDNN CPU for rates up to layers.MAX_ONE_OP_RATE), as a sum
  of nine shifted products, and band by band (layers.
  dilated_depthwise_by_bands, what CPU towers use where twice the rate is
  at least the input's size), for ASPP (rates 6/12/18 on 21x21x2048),
  xception_65's exit flow at OS16 and mobilenet_v2 OS8 shapes. Prints the
  largest relative difference of each form from space-to-batch too;
- filter_gradient: the filter gradient of a convolution as oneDNN's
  Conv2DBackpropFilter and as a matmul over the input's patches
  (layers.conv2d_filter_gradient_by_patches, what the training towers use
  on a oneDNN CPU for stride-1 inputs of at least
  layers.MIN_PATCH_GRADIENT_PIXELS pixels), for the stem convolutions of
  xception_65 and the resnet "beta" variants and for resnet's 3x3
  convolutions (batch 2, crop 321; resnet's block1 at crop 513 too), with
  the largest relative difference;
- depthwise_filter_gradient: the filter gradient of a 3x3 depthwise
  convolution (stride 1, SAME, dilated or not) as TensorFlow builds it
  (the undilated kernel, after space-to-batch where dilated; oneDNN's
  where its kernels are on), the same in TensorFlow's own kernel (layers.
  tf_kernel_filter_gradients, what the towers of float32 graphs use on a
  oneDNN CPU without AVX-512 for the shapes of layers.
  MAX_TF_KERNEL_FILTER_GRADIENT_CHANNELS) and as one depthwise
  convolution of the padded input with the output gradient as its kernel
  (depthwise_filter_gradient_by_conv), for the shapes of xception_65 OS16
  (ASPP, exit flow, middle flow, entry flow, decoder) and mobilenet_v2
  OS8, and widths around the rule's bounds, with the largest relative
  differences;
- strided_depthwise: a stride-2 3x3 depthwise convolution ('SAME') with
  both gradients as TensorFlow builds it and with the input gradient at
  stride 1 (layers.strided_depthwise_spread_input_gradient, what the
  towers of bf16 graphs use on a oneDNN CPU), in float32 and in bfloat16,
  for the stride-2 layers of mobilenet_v2 (batch 4) and xception_65
  (batch 2) at crop 321, with the largest relative difference of the
  input gradient;
- bn_moments: a 1x1 convolution that widens its input, with trained BN
  and ReLU6, forward, gradients and moving-average updates, with the BN op
  and with the output's moments from the input's
  (layers.expanded_batch_norm, what the towers of float32 graphs use on a
  oneDNN CPU where layers.MAX_INPUT_MOMENT_RATIO admits the shape), for
  mobilenet_v2 OS8's expansions (batch 4, crop 321) and two wider inputs
  the rule leaves out, with whether the towers take the moments form and
  the largest relative difference of the output and the input gradient
  (at ReLU6's kinks a rounding difference can flip a pixel's gradient, so
  an occasional 1e-2 is not a fault);
- bn_padded: a 1x1 convolution with trained BN and ReLU6, forward,
  gradients and moving-average updates, with the BN op on the output's
  channels and on them padded with zero channels to a multiple of
  layers.BATCH_NORM_CHANNEL_BLOCK (layers.batch_norm_channels_padded, what
  the towers use where oneDNN's kernels use AVX-512), in
  float32 and in bfloat16, for mobilenet_v2 OS8's 24-channel projections
  (batch 4, crop 321) and other widths, with whether the towers pad it
  and the largest relative difference of the output and the input
  gradient;
- activations: ReLU and ReLU6 with their gradients on TensorFlow's
  kernels and compiled by XLA (layers.activate inside
  layers.activations_in_xla, what the towers of bf16 graphs use on a
  oneDNN CPU), in float32 and in bfloat16, for activation shapes of
  mobilenet_v2 OS8 (batch 4) and xception_65 OS16 (batch 2) at crop 321,
  with whether the values are the same;
- weight_decay: the momentum update of every weight of xception_65 OS16
  with decoder 4 and of mobilenet_v2 OS8 (crop 321, 21 classes) with its
  weight decay, as the L2 losses' gradients added to the gradients and
  TensorFlow's momentum op, and through the accumulation
  (momentum.MomentumWithDecayInAccumulator, what the training graph uses
  with momentum), with the largest relative difference of the weights
  after the timed updates.

Each figure is the best of three medians of --repeats runs of one op in
its own graph, after warm-up; the inputs are variables, so that grappler
cannot fold the ops away. Run it twice before trusting a difference: on a
shared 2-core machine the same matmul moves between 80 and 140 GFLOP/s
from one run to the next.
"""
import argparse
import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from deeplab_train.runtime import cpu  # noqa: E402

cpu.apply_process_settings()

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

from deeplab_train import config as config_lib  # noqa: E402
from deeplab_train.bench import compare  # noqa: E402
from deeplab_train.model import deeplab  # noqa: E402
from deeplab_train.model import layers  # noqa: E402
from deeplab_train.runtime import session_config  # noqa: E402
from deeplab_train.train import momentum  # noqa: E402

tf.disable_eager_execution()

# (pixels, input channels, output channels) of 1x1 convolutions.
MATMUL_SHAPES = (
    (4 * 161 * 161, 16, 96), (4 * 81 * 81, 24, 144), (4 * 81 * 81, 144, 24),
    (4 * 41 * 41, 64, 384), (4 * 41 * 41, 576, 160), (4 * 41 * 41, 960, 160),
    (2 * 81 * 81, 256, 256), (2 * 21 * 21, 728, 728),
    (2 * 21 * 21, 720, 720), (2 * 21 * 21, 768, 768),
    (2 * 21 * 21, 1536, 1536))
# (NHWC input shape, output channels) of 1x1 convolutions.
CONV1X1_CASES = (((2, 21, 21, 728), 728), ((2, 21, 21, 1536), 1536),
                 ((2, 41, 41, 728), 728), ((2, 81, 81, 256), 256),
                 ((4, 41, 41, 64), 384), ((4, 41, 41, 384), 64),
                 ((4, 41, 41, 576), 96), ((4, 81, 81, 144), 24))
REDUCE_SHAPES = ((2, 161, 161, 128), (2, 81, 81, 256), (2, 41, 41, 728),
                 (2, 21, 21, 728), (4, 161, 161, 96), (4, 41, 41, 576))
# (NHWC shape, rate) of dilated depthwise convolutions.
ATROUS_CASES = (((2, 21, 21, 2048), 6), ((2, 21, 21, 2048), 12),
                ((2, 21, 21, 2048), 18), ((2, 33, 33, 2048), 12),
                ((2, 33, 33, 2048), 18), ((2, 21, 21, 1536), 2),
                ((4, 41, 41, 384), 2), ((4, 41, 41, 576), 2),
                ((4, 41, 41, 960), 4), ((4, 41, 41, 384), 6))
# (NHWC shape, rate) of 3x3 depthwise convolutions whose filter gradient
# is timed.
DEPTHWISE_FILTER_CASES = (
    ((2, 21, 21, 2048), 6), ((2, 21, 21, 2048), 12), ((2, 21, 21, 2048), 18),
    ((2, 21, 21, 1536), 2), ((2, 21, 21, 728), 1), ((2, 161, 161, 128), 1),
    ((2, 81, 81, 304), 1), ((4, 161, 161, 96), 1), ((4, 41, 41, 576), 2),
    ((4, 41, 41, 960), 4), ((4, 41, 41, 960), 1), ((4, 81, 81, 144), 1),
    ((4, 161, 161, 32), 1), ((2, 21, 21, 1024), 1), ((2, 41, 41, 1024), 1),
    ((2, 21, 21, 2048), 1), ((2, 41, 41, 728), 1))
# (NHWC input, output channels) of 1x1 convolutions with trained BN:
# mobilenet_v2 OS8's expansions, then two inputs the rule leaves out.
BN_MOMENTS_CASES = (((4, 161, 161, 16), 96), ((4, 81, 81, 24), 144),
                    ((4, 41, 41, 32), 192), ((4, 41, 41, 64), 384),
                    ((4, 41, 41, 96), 576), ((4, 41, 41, 160), 960),
                    ((2, 81, 81, 128), 256), ((2, 21, 21, 256), 1024))
# NHWC inputs of stride-2 depthwise convolutions: mobilenet_v2's
# expanded_conv_1 and _3, xception_65's entry flow blocks 1-3 (padded).
STRIDED_DEPTHWISE_SHAPES = ((4, 161, 161, 96), (4, 81, 81, 144),
                            (2, 163, 163, 128), (2, 83, 83, 256),
                            (2, 43, 43, 728))
# (NHWC input, kernel, output channels, stride, padding) of convolutions.
FILTER_GRADIENT_CASES = (
    ((2, 161, 161, 32), 3, 64, 1, 'SAME'),    # xception_65 entry conv1_2
    ((2, 161, 161, 64), 3, 64, 1, 'SAME'),    # resnet beta conv1_2
    ((2, 161, 161, 64), 3, 128, 1, 'SAME'),   # resnet beta conv1_3
    ((2, 129, 129, 64), 3, 64, 1, 'SAME'),    # resnet block1, crop 513
    ((2, 81, 81, 64), 3, 64, 1, 'SAME'),      # resnet block1
    ((2, 41, 41, 128), 3, 128, 1, 'SAME'),    # resnet block2
    ((2, 21, 21, 256), 3, 256, 1, 'SAME'),    # resnet block3, OS16
    ((2, 323, 323, 3), 3, 32, 2, 'VALID'),    # xception_65 entry conv1_1
)


def _variable(shape, seed, dtype=tf.float32, scale=1.0):
  """A variable of `dtype` holding standard normal values of `seed`, times
  `scale`."""
  rng = np.random.RandomState(seed)
  return tf.Variable(tf.cast(
      scale * rng.standard_normal(shape).astype(np.float32), dtype))


def _depthwise_inputs(shape):
  """Input, 3x3 depthwise weights and output gradient for an NHWC shape."""
  return (_variable(shape, 0), _variable((3, 3, shape[3], 1), 1),
          _variable(shape, 2))


def _scalar(t):
  """A scalar that needs all of `t` computed, fetched instead of `t`."""
  return tf.reduce_sum(t[tuple(slice(0, 1) for _ in t.shape)])


def _relative_difference(reference, value):
  """Largest |value - reference| over the largest |reference|."""
  return float(np.abs(value - reference).max() / np.abs(reference).max())


def time_ops(named_ops, config, repeats):
  """{name: seconds} for ops of the default graph, alternated."""
  return time_and_fetch(named_ops, [], config, repeats)[0]


def time_and_fetch(named_ops, fetches, config, repeats):
  """({name: seconds} of `named_ops` as time_ops, the values of `fetches`
  after the timing), from one session."""
  best = {}
  with tf.Session(config=config) as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(3):
      for name, op in named_ops.items():
        sess.run(op)
        times = []
        for _ in range(repeats):
          start = time.perf_counter()
          sess.run(op)
          times.append(time.perf_counter() - start)
        median = sorted(times)[len(times) // 2]
        best[name] = min(best.get(name, median), median)
    return best, sess.run(fetches)


def bench_matmul(config, repeats):
  print('1x1 convolution as a matmul, GFLOP/s (pixels, in, out):')
  for pixels, cin, cout in MATMUL_SHAPES:
    with tf.Graph().as_default():
      x = _variable((pixels, cin), 0)
      dy = _variable((pixels, cout), 1)
      w = _variable((cin, cout), 2)
      ops = {'forward': _scalar(tf.matmul(x, w)),
             'input grad': _scalar(tf.matmul(dy, w, transpose_b=True)),
             'weight grad': _scalar(tf.matmul(x, dy, transpose_a=True))}
      seconds = time_ops(ops, config, repeats)
    flops = 2.0 * pixels * cin * cout
    print('  %-22s %s' % ((pixels, cin, cout), '  '.join(
        '%s %6.1f' % (name, flops / s / 1e9) for name, s in seconds.items())))


def bench_conv1x1(config, repeats):
  print('1x1 convolution, forward and both gradients, ms (GFLOP/s) '
        '(input, outputs):')
  for dtype in (tf.float32, tf.bfloat16):
    for shape, outputs in CONV1X1_CASES:
      with tf.Graph().as_default():
        x = _variable(shape, 0, dtype)
        w = _variable((1, 1, shape[3], outputs), 1, dtype)
        upstream = _variable(shape[:3] + (outputs,), 2, dtype)
        forms = {
            'matmul': tf.reshape(
                tf.matmul(tf.reshape(x, [-1, shape[3]]), w[0, 0]),
                shape[:3] + (outputs,)),
            'Conv2D': tf.nn.conv2d(x, w, [1, 1, 1, 1], 'SAME')}
        ops = {name: tf.add_n([tf.cast(_scalar(t), tf.float32) for t in
                               [y] + tf.gradients(y, [x, w], upstream)])
               for name, y in forms.items()}
        seconds = time_ops(ops, config, repeats)
      flops = 3 * 2.0 * np.prod(shape) * outputs
      print('  %-8s %-18s %4d  %s' % (dtype.name, shape, outputs, '  '.join(
          '%s %6.2f (%3.0f)' % (name, s * 1e3, flops / s / 1e9)
          for name, s in seconds.items())))


def bench_reduce(config, repeats):
  print('gradient of a per-channel offset, ms (NHWC shape):')
  for shape in REDUCE_SHAPES:
    with tf.Graph().as_default():
      dy = _variable(shape, 0) + 0.0  # an op's output, as in a graph
      pixels = int(np.prod(shape[:3]))
      ops = {'none': _scalar(dy),
             'reduce_sum': tf.reduce_sum(dy, [0, 1, 2]),
             'BiasAddGrad': tf.raw_ops.BiasAddGrad(out_backprop=dy),
             'ones matmul': tf.matmul(tf.ones([1, pixels]),
                                      tf.reshape(dy, [pixels, shape[3]]))}
      seconds = time_ops(ops, config, repeats)
    base = seconds.pop('none')
    print('  %-22s %s' % (shape, '  '.join(
        '%s %5.2f' % (name, (s - base) * 1e3)
        for name, s in seconds.items())))


def atrous_by_taps(x, w, rate):
  """SAME, stride-1 dilated depthwise convolution as a sum of shifted
  products, one per filter tap (taps wholly outside the input skipped)."""
  _, height, width, _ = x.shape.as_list()
  kh, kw = w.shape.as_list()[:2]
  parts = []
  for i in range(kh):
    dh = (i - (kh - 1) // 2) * rate
    for j in range(kw):
      dw = (j - (kw - 1) // 2) * rate
      if abs(dh) >= height or abs(dw) >= width:
        continue
      window = x[:, max(dh, 0):height + min(dh, 0),
                 max(dw, 0):width + min(dw, 0), :]
      product = window * w[i, j, :, 0]
      parts.append(tf.pad(product, [[0, 0], [max(-dh, 0), max(dh, 0)],
                                    [max(-dw, 0), max(dw, 0)], [0, 0]]))
  return tf.add_n(parts)


def bench_atrous(config, repeats):
  print('dilated 3x3 depthwise convolution, forward and both gradients, ms:')
  for shape, rate in ATROUS_CASES:
    with tf.Graph().as_default():
      x, w, upstream = _depthwise_inputs(shape)
      forms = {
          'space-to-batch': tf.nn.depthwise_conv2d(
              x, w, [1, 1, 1, 1], 'SAME', dilations=[rate, rate]),
          'nine taps': atrous_by_taps(x, w, rate),
          'bands': layers.dilated_depthwise_by_bands(x, w, (rate, rate))}
      if session_config.onednn_kernels_on():  # only oneDNN's kernel dilates
        forms['one op'] = layers.dilated_depthwise_one_op(x, w, (rate, rate))
      results, ops = {}, {}
      for name, y in forms.items():
        results[name] = [y] + tf.gradients(y, [x, w], grad_ys=upstream)
        ops[name] = tf.add_n([_scalar(t) for t in results[name]])
      seconds, values = time_and_fetch(ops, results, config, repeats)
    reference = values.pop('space-to-batch')
    differences = {
        name: max(_relative_difference(p, q)
                  for p, q in zip(reference, form))
        for name, form in values.items()}
    print('  %-18s rate %-2d %s  (largest relative difference from '
          'space-to-batch: %s)' % (
              shape, rate, '  '.join('%s %6.1f' % (name, s * 1e3)
                                     for name, s in seconds.items()),
              ', '.join('%s %.1e' % item for item in differences.items())))


def bench_filter_gradient(config, repeats):
  print('filter gradient of a convolution, ms (input, kernel, outputs, '
        'stride):')
  for shape, kernel, outputs, stride, padding in FILTER_GRADIENT_CASES:
    with tf.Graph().as_default():
      x = _variable(shape, 0)
      w = _variable((kernel, kernel, shape[3], outputs), 1)
      y = tf.nn.conv2d(x, w, stride, padding)
      upstream = _variable(y.shape.as_list(), 2)
      forms = {'oneDNN': tf.gradients(y, w, upstream)[0]}
      if stride == 1:
        forms['patches'] = tf.gradients(
            layers.conv2d_filter_gradient_by_patches(x, w, padding), w,
            upstream)[0]
      seconds, values = time_and_fetch(
          {name: _scalar(g) for name, g in forms.items()}, forms, config,
          repeats)
    reference = values.pop('oneDNN')
    differences = ', '.join(
        '%s %.1e' % (name, _relative_difference(reference, v))
        for name, v in values.items())
    print('  %-18s %dx%d %4d s%d  %s%s' % (
        shape, kernel, kernel, outputs, stride, '  '.join(
            '%s %6.1f' % (name, s * 1e3) for name, s in seconds.items()),
        '  (largest relative difference: %s)' % differences
        if differences else ''))


def depthwise_filter_gradient_by_conv(x, dy, kernel, rate):
  """The filter gradient [kernel, kernel, C, 1] of a stride-1 'SAME'
  depthwise convolution of x (odd kernel, dilation `rate`) with output
  gradient dy, as one depthwise convolution: the padded input with its
  batch moved beside the channels (N*C channels of one image) is convolved
  with dy as the kernel, stride `rate`, giving kernel x kernel outputs per
  (image, channel), then summed over the images."""
  batch, height, width, channels = x.shape.as_list()
  pad = rate * (kernel - 1) // 2
  padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
  image = tf.reshape(tf.transpose(padded, [1, 2, 0, 3]),
                     [1, height + 2 * pad, width + 2 * pad, batch * channels])
  taps = tf.reshape(tf.transpose(dy, [1, 2, 0, 3]),
                    [height, width, batch * channels, 1])
  products = tf.nn.depthwise_conv2d_native(image, taps, [1, rate, rate, 1],
                                           'VALID')
  return tf.reduce_sum(
      tf.reshape(products, [kernel, kernel, batch, channels]), axis=2)[
          :, :, :, tf.newaxis]


def bench_depthwise_filter_gradient(config, repeats):
  print('filter gradient of a 3x3 depthwise convolution, ms (input, rate):')
  for shape, rate in DEPTHWISE_FILTER_CASES:
    with tf.Graph().as_default():
      x, w, upstream = _depthwise_inputs(shape)
      y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], 'SAME',
                                 dilations=[rate, rate])
      with layers.tf_kernel_filter_gradients():
        y_tf_kernel = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], 'SAME',
                                             dilations=[rate, rate])
      forms = {'TensorFlow': tf.gradients(y, w, upstream)[0],
               "TensorFlow's kernel": tf.gradients(y_tf_kernel, w,
                                                   upstream)[0],
               'as a convolution': depthwise_filter_gradient_by_conv(
                   x, upstream, 3, rate)}
      seconds, values = time_and_fetch(
          {name: _scalar(g) for name, g in forms.items()}, forms, config,
          repeats)
    print('  %-18s rate %-2d %s  (largest relative difference: %s)' % (
        shape, rate, '  '.join('%s %6.2f' % (name, s * 1e3)
                               for name, s in seconds.items()),
        ', '.join('%.1e' % _relative_difference(values['TensorFlow'],
                                                values[name])
                  for name in forms if name != 'TensorFlow')))


def bench_strided_depthwise(config, repeats):
  print('stride-2 3x3 depthwise convolution, forward and both gradients, '
        'ms (input):')
  for dtype in (tf.float32, tf.bfloat16):
    for shape in STRIDED_DEPTHWISE_SHAPES:
      with tf.Graph().as_default():
        x = _variable(shape, 0, dtype)
        w = _variable((3, 3, shape[3], 1), 1, dtype)
        forms = {'TensorFlow': tf.nn.depthwise_conv2d_native(
                     x, w, [1, 2, 2, 1], 'SAME'),
                 'input gradient at stride 1':
                     layers.strided_depthwise_spread_input_gradient(
                         x, w, 2, 'SAME')}
        upstream = _variable(forms['TensorFlow'].shape.as_list(), 2, dtype)
        grads = {name: tf.gradients(y, [x, w], upstream)
                 for name, y in forms.items()}
        ops = {name: tf.add_n([tf.cast(_scalar(t), tf.float32)
                               for t in [forms[name]] + grads[name]])
               for name in forms}
        seconds, values = time_and_fetch(
            ops, {name: tf.cast(g[0], tf.float32)
                  for name, g in grads.items()}, config, repeats)
      print('  %-8s %-18s %s  (largest relative difference: %.1e)' % (
          dtype.name, shape, '  '.join(
              '%s %6.2f' % (name, s * 1e3) for name, s in seconds.items()),
          _relative_difference(values['TensorFlow'],
                               values['input gradient at stride 1'])))


# Activation shapes: mobilenet_v2 OS8 batch 4 (expanded_conv_1's
# expansion, expanded_conv_3's, a dilated block's) and xception_65's entry
# flow block1 and middle flow, batch 2, crop 321.
ACTIVATION_SHAPES = (
    (4, 161, 161, 96), (4, 81, 81, 144), (4, 41, 41, 576),
    (2, 161, 161, 128), (2, 21, 21, 728),
)


def bench_bn_moments(config, repeats):
  print('1x1 convolution, trained BN and ReLU6 with gradients and updates, '
        'ms, BN op / moments from the input (input, outputs; whether the '
        'towers take the moments form):')
  params = layers.ConvParams(bn_training=True, activation=tf.nn.relu6)
  for shape, outputs in BN_MOMENTS_CASES:
    with tf.Graph().as_default():
      x = _variable(shape, 0)
      upstream = _variable(shape[:3] + (outputs,), 2)
      ops, values = {}, {}
      for moments in (False, True):
        with tf.variable_scope('layer', reuse=moments), \
            layers.recording() as rec:
          if moments:
            # Built directly: the towers' rule may leave the shape out.
            with tf.variable_scope('conv'):
              y = layers.expanded_batch_norm(
                  x, tf.get_variable('weights'), params)
          else:
            y = layers.conv2d(x, outputs, 1, params, 'conv')
        trained = tf.trainable_variables('layer')
        grads = tf.gradients(y, [x] + trained, upstream)
        # A sum of the values, not a tf.group of them: grappler turns ops
        # whose values no op reads into no-ops.
        with tf.control_dependencies(rec.update_ops):
          ops[moments] = tf.add_n([_scalar(t) for t in [y] + grads])
        values[moments] = [y, grads[0]]
      seconds, fetched = time_and_fetch(ops, values, config, repeats)
    difference = max(_relative_difference(a, b)
                     for a, b in zip(fetched[False], fetched[True]))
    taken = layers._input_moments_pay(shape[3], outputs)
    print('  %-18s %4d  %6.2f / %6.2f  %-8s  difference %.1e' % (
        shape, outputs, seconds[False] * 1e3, seconds[True] * 1e3,
        'taken' if taken else 'left out', difference))


# (input shape, output channels): mobilenet_v2 OS8's projections to 24
# channels (batch 4, crop 321), a block's width for comparison, other
# widths off the block, and xception_65's 728 (batch 2).
BN_PADDED_CASES = (
    ((4, 81, 81, 96), 24), ((4, 81, 81, 144), 24), ((4, 81, 81, 96), 32),
    ((4, 41, 41, 96), 40), ((4, 41, 41, 96), 200), ((4, 41, 41, 96), 360),
    ((2, 41, 41, 728), 728), ((2, 21, 21, 728), 728),
)


def bench_bn_padded(config, repeats):
  print('1x1 convolution, trained BN and ReLU6 with gradients and updates, '
        'ms, BN op / on channels padded (input, outputs; whether the towers '
        'pad it where oneDNN uses AVX-512):')
  params = layers.ConvParams(bn_training=True, activation=tf.nn.relu6)
  for dtype in (tf.float32, tf.bfloat16):
    for shape, outputs in BN_PADDED_CASES:
      with tf.Graph().as_default():
        x = _variable(shape, 0, dtype)
        upstream = _variable(shape[:3] + (outputs,), 2, dtype)
        ops, values = {}, {}
        for padded in (False, True):
          with tf.variable_scope('layer', reuse=padded), \
              layers.recording() as rec, \
              layers.batch_norm_channels_padded(padded):
            y = layers.conv2d(x, outputs, 1, params, 'conv')
          trained = tf.trainable_variables('layer')
          grads = tf.gradients(y, [x] + trained, upstream)
          with tf.control_dependencies(rec.update_ops):
            ops[padded] = tf.add_n([tf.cast(_scalar(t), tf.float32)
                                    for t in [y] + grads])
          values[padded] = [tf.cast(y, tf.float32),
                            tf.cast(grads[0], tf.float32)]
        seconds, fetched = time_and_fetch(ops, values, config, repeats)
      difference = max(_relative_difference(a, b)
                       for a, b in zip(fetched[False], fetched[True]))
      with layers.batch_norm_channels_padded():
        taken = layers._batch_norm_channel_padding(outputs) > 0
      print('  %-8s %-18s %4d  %6.2f / %6.2f  %-8s  difference %.1e' % (
          dtype.name, shape, outputs, seconds[False] * 1e3,
          seconds[True] * 1e3, 'padded' if taken else 'left out',
          difference))


def bench_activations(config, repeats):
  print('activation and its gradient, ms (TensorFlow / XLA):')
  for dtype in (tf.float32, tf.bfloat16):
    for shape in ACTIVATION_SHAPES:
      row = []
      for name, activation in (('relu', tf.nn.relu), ('relu6', tf.nn.relu6)):
        with tf.Graph().as_default():
          # Four times a standard normal: some of it above ReLU6's cap.
          x = _variable(shape, 0, dtype, scale=4)
          upstream = _variable(shape, 2, dtype)
          ops, values = {}, {}
          for compiled in (False, True):
            with layers.activations_in_xla(compiled):
              y = layers.activate(activation, x)
            (dx,) = tf.gradients(y, x, upstream)
            ops[compiled] = tf.add(tf.cast(_scalar(y), tf.float32),
                                   tf.cast(_scalar(dx), tf.float32))
            values[compiled] = [tf.cast(y, tf.float32),
                                tf.cast(dx, tf.float32)]
          seconds, fetched = time_and_fetch(ops, values, config, repeats)
        same = all(np.array_equal(a, b)
                   for a, b in zip(fetched[False], fetched[True]))
        row.append('%s %6.2f / %6.2f%s' % (
            name, seconds[False] * 1e3, seconds[True] * 1e3,
            '' if same else ' (values differ)'))
      print('  %-8s %-18s %s' % (dtype.name, shape, '  '.join(row)))


# Model options of the models whose weights bench_weight_decay updates.
WEIGHT_DECAY_MODELS = (
    dict(model_variant='xception_65', output_stride=16,
         atrous_rates=(6, 12, 18), decoder_output_stride=(4,)),
    dict(model_variant='mobilenet_v2', output_stride=8))


def _decayed_weights(model):
  """[(shape, L2 factor)] of the weights with weight decay of a model
  (`model`: ModelOptions fields), built in a scratch graph."""
  options = config_lib.ModelOptions(num_classes=21, crop_size=(321, 321),
                                    **model).validate()
  with tf.Graph().as_default(), layers.recording() as rec:
    deeplab.multi_scale_logits(
        tf.zeros([1, 321, 321, 3]), options, is_training=True)
    return [(var.shape.as_list(), factor)
            for var, factor in rec.weight_decays]


def bench_weight_decay(config, repeats):
  print('momentum update of every weight with its weight decay, ms, the '
        'decay\'s gradient / through the accumulation (model, weights):')
  for model in WEIGHT_DECAY_MODELS:
    weights = _decayed_weights(model)
    with tf.Graph().as_default():
      gradients = [_variable(shape, 2 * k) for k, (shape, _) in
                   enumerate(weights)]
      ops, values = {}, {}
      for through_accumulation in (False, True):
        variables = [_variable(shape, 2 * k + 1, scale=0.05)
                     for k, (shape, _) in enumerate(weights)]
        decays = {var: factor for var, (_, factor) in zip(variables, weights)}
        pairs = [(grad.read_value(), var)
                 for grad, var in zip(gradients, variables)]
        if through_accumulation:
          optimizer = momentum.MomentumWithDecayInAccumulator(0.01, 0.9,
                                                              decays)
        else:
          optimizer = tf.train.MomentumOptimizer(0.01, 0.9)
          loss = tf.add_n([factor * tf.nn.l2_loss(var)
                           for var, factor in decays.items()])
          pairs = [(tf.add_n([grad, decay]), var) for (grad, var), decay
                   in zip(pairs, tf.gradients(loss, variables))]
        ops[through_accumulation] = optimizer.apply_gradients(pairs)
        values[through_accumulation] = variables
      seconds, fetched = time_and_fetch(ops, values, config, repeats)
    difference = max(_relative_difference(a, b)
                     for a, b in zip(fetched[False], fetched[True]))
    print('  %-14s %8d  %6.2f / %6.2f  difference %.1e' % (
        model['model_variant'],
        sum(int(np.prod(shape)) for shape, _ in weights),
        seconds[False] * 1e3, seconds[True] * 1e3, difference))


BENCHES = {'matmul': bench_matmul, 'conv1x1': bench_conv1x1,
           'reduce': bench_reduce,
           'atrous': bench_atrous, 'filter_gradient': bench_filter_gradient,
           'depthwise_filter_gradient': bench_depthwise_filter_gradient,
           'strided_depthwise': bench_strided_depthwise,
           'bn_moments': bench_bn_moments, 'bn_padded': bench_bn_padded,
           'activations': bench_activations,
           'weight_decay': bench_weight_decay}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--only', default=','.join(BENCHES),
                      help='comma-separated: %s' % ', '.join(BENCHES))
  parser.add_argument('--repeats', type=int, default=15)
  parser.add_argument('--threads', type=int, default=None,
                      help='intra- and inter-op threads (default: as '
                      'deeplab-train, every usable core)')
  args = parser.parse_args()
  names = [n for n in args.only.split(',') if n]
  unknown = sorted(set(names) - set(BENCHES))
  if unknown:
    parser.error('--only: unknown %s (choose from %s)'
                 % (', '.join(unknown), ', '.join(BENCHES)))
  # The training session's settings, as deeplab-train makes them.
  config = session_config.make_session_config(
      intra_op_threads=args.threads, inter_op_threads=args.threads)
  print('%s; %s=%s; threads intra %d, inter %d' % (
      compare.cpu_line(cpu.machine_cpu()), cpu.ONEDNN_ENV,
      os.environ.get(cpu.ONEDNN_ENV), config.intra_op_parallelism_threads,
      config.inter_op_parallelism_threads))
  for name in names:
    BENCHES[name](config, args.repeats)


if __name__ == '__main__':
  main()
