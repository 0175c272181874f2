"""A convolution whose filter gradient is a matmul over the input's patches
(layers.filter_gradient_as_matmul): the same output and gradients as
tf.nn.conv2d, only for the convolutions it covers, and in the training
towers only where oneDNN's CPU kernels run."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import session_config
from deeplab_train.train import towers

import model_testing

PLAIN = layers.ConvParams(batch_norm=None, activation=None)


def _patch_ops(graph):
  return [op for op in graph.get_operations()
          if op.type == 'ExtractImagePatches']


def _output_and_gradients(by_patches, kernel, padding, stride, rate, shape):
  """[y, dy/dx, dy/dweights] of a conv2d layer, and its patch ops."""
  def build(x):
    with layers.filter_gradient_as_matmul(by_patches):
      return layers.conv2d(x, 4, kernel, PLAIN, 'conv', stride=stride,
                           rate=rate, padding=padding, use_bias=False)
  values, graph = model_testing.layer_output_and_gradients(build, shape)
  return values, _patch_ops(graph)


# (kernel, padding, stride, rate, input shape, whether the form applies)
# with MIN_PATCH_GRADIENT_PIXELS at 13 * 11 (the default input's pixels).
CASES = {
    '3x3 SAME': (3, 'SAME', 1, 1, (2, 13, 11, 3), True),
    '3x3 VALID': (3, 'VALID', 1, 1, (2, 13, 11, 3), True),
    '1x3 SAME': ((1, 3), 'SAME', 1, 1, (2, 13, 11, 3), True),
    '5x5 SAME, 8 channels': (5, 'SAME', 1, 1, (1, 13, 11, 8), True),
    '4x4 SAME (even kernel)': (4, 'SAME', 1, 1, (2, 13, 11, 3), True),
    '3x3 stride 2': (3, 'SAME', 2, 1, (2, 13, 11, 3), False),
    '3x3 rate 2': (3, 'SAME', 1, 2, (2, 13, 11, 3), False),
    '1x1': (1, 'SAME', 1, 1, (2, 13, 11, 3), False),
    '3x3 on a smaller input': (3, 'SAME', 1, 1, (2, 12, 11, 3), False),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_patches_form_equals_conv2d(monkeypatch, name):
  kernel, padding, stride, rate, shape, applies = CASES[name]
  monkeypatch.setattr(layers, 'MIN_PATCH_GRADIENT_PIXELS', 13 * 11)
  args = (kernel, padding, stride, rate, shape)
  plain, plain_ops = _output_and_gradients(False, *args)
  patched, patch_ops = _output_and_gradients(True, *args)
  assert not plain_ops
  assert len(patch_ops) == (1 if applies else 0), patch_ops
  model_testing.assert_same_output_and_gradients(plain, patched)


@pytest.mark.parametrize('rows_per_band', [1, 4])
@pytest.mark.parametrize(
    'name', sorted(name for name, case in CASES.items() if case[-1]))
def test_patches_in_bands_equal_conv2d(monkeypatch, name, rows_per_band):
  kernel, padding, stride, rate, shape, _ = CASES[name]
  monkeypatch.setattr(layers, 'MIN_PATCH_GRADIENT_PIXELS', 13 * 11)
  args = (kernel, padding, stride, rate, shape)
  plain, _ = _output_and_gradients(False, *args)
  batch, rows, cols = plain[0].shape[:3]
  patch_size = np.prod(plain[2].shape[:3])  # kh * kw * input channels
  monkeypatch.setattr(layers, 'MAX_PATCH_FLOATS',
                      rows_per_band * batch * cols * patch_size)
  patched, patch_ops = _output_and_gradients(True, *args)
  # 13 or 11 output rows: with 4 rows a band, the last band is shorter.
  assert len(patch_ops) == -(-rows // rows_per_band)
  model_testing.assert_same_output_and_gradients(plain, patched)


@pytest.mark.parametrize('onednn', [True, False])
def test_towers_use_the_patches_form_where_onednn_runs(monkeypatch, onednn):
  monkeypatch.setattr(session_config, 'onednn_kernels_on', lambda: onednn)
  monkeypatch.setattr(session_config, 'gpus_visible', lambda: False)
  monkeypatch.setattr(layers, 'MIN_PATCH_GRADIENT_PIXELS', 1)

  def tower_fn(index):
    del index
    y = layers.conv2d(tf.zeros([1, 5, 5, 2]), 3, 3, PLAIN, 'conv')
    return tf.reduce_sum(y), {}, y

  for forms in (True, False):
    with tf.Graph().as_default() as graph:
      (tower,) = towers.build_towers(tower_fn, ['/cpu:0'],
                                     onednn_forms=forms)
      tf.gradients(tower.data_loss, tf.trainable_variables())
    assert len(_patch_ops(graph)) == (1 if forms and onednn else 0)
