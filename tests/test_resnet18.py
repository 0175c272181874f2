"""Tests of resnet_v1_18 and resnet_v1_18_beta beyond the manifests.

The manifests (test_manifests.py) check their variables; the numeric
reference (test_reference_numeric.py) checks resnet_v1_18_beta's maths.
Here: the lite units' shapes, strides and atrous rates, multi_grid's two
values, resnet_v1_18's odd padding value, and two training steps of each.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError, ModelOptions
from deeplab_train.model import layers
from deeplab_train.model import registry
import train_testing as tt

VARIANTS = ('resnet_v1_18', 'resnet_v1_18_beta')
UNIT = 'lite_bottleneck_v1'


def _build(variant, crop=33, batch=1, output_stride=16, multi_grid=None):
  """One backbone in a fresh graph: (graph, features, end_points, images)."""
  backbone = registry.get(variant)
  opts = ModelOptions(model_variant=variant, output_stride=output_stride,
                      multi_grid=multi_grid)
  graph = tf.Graph()
  with graph.as_default(), layers.recording():
    images = tf.placeholder(tf.float32, [batch, crop, crop, 3])
    features, end_points = backbone.build(
        backbone.normalize(images), opts, True, True, 4e-5)
  return graph, features, end_points, images


def _atrous_rate(graph, scope):
  """The rate of the conv under `scope` (dilations or space-to-batch)."""
  for op in graph.get_operations():
    if op.name.startswith(scope + '/'):
      if op.type == 'SpaceToBatchND':
        return int(tf.get_static_value(op.inputs[1])[0])
      if op.type == 'Conv2D':
        return op.get_attr('dilations')[1]
  raise AssertionError('no conv under %s' % scope)


@pytest.mark.parametrize('variant', VARIANTS)
def test_registered_like_the_original(variant):
  backbone = registry.get(variant)
  assert backbone.scope == 'resnet_v1_18'
  # The original's decoder end points: the first unit's linear conv2.
  assert backbone.decoder_end_points == {
      stride: ('block%d/unit_1/%s/conv2' % (b, UNIT),)
      for b, stride in ((1, 4), (2, 8), (3, 16))}
  assert backbone.default_weight_decay == pytest.approx(4e-5)


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('output_stride', [8, 16, 32])
def test_feature_and_end_point_shapes(variant, output_stride):
  crop = 65
  _, features, end_points, _ = _build(variant, crop=crop, batch=2,
                                      output_stride=output_stride)
  side = lambda stride: -(-crop // min(stride, output_stride))
  assert features.shape.as_list() == [2, side(32), side(32), 512]
  depths = {4: 64, 8: 128, 16: 256}
  for stride, (name,) in registry.get(variant).decoder_end_points.items():
    assert end_points[name].shape.as_list() == [
        2, side(stride), side(stride), depths[stride]], name


@pytest.mark.parametrize('output_stride,multi_grid,expected', [
    (16, None, (2, 2)),
    (16, (1, 2), (2, 4)),
    (8, (1, 2), (4, 8)),
    (32, (2, 3), (2, 3)),
])
def test_block4_rates_follow_multi_grid(output_stride, multi_grid, expected):
  graph, _, _, _ = _build('resnet_v1_18_beta', output_stride=output_stride,
                          multi_grid=multi_grid)
  for unit, rate in zip((1, 2), expected):
    # Both 3x3 convs of a lite unit run at the unit's rate.
    for conv in ('conv1', 'conv2'):
      scope = 'resnet_v1_18/block4/unit_%d/%s/%s' % (unit, UNIT, conv)
      assert _atrous_rate(graph, scope) == rate, scope
  # Block3's convs are atrous only below output stride 16.
  assert _atrous_rate(graph, 'resnet_v1_18/block3/unit_2/%s/conv1' % UNIT) == (
      2 if output_stride == 8 else 1)


@pytest.mark.parametrize('variant', VARIANTS)
def test_multi_grid_takes_two_values(variant):
  with pytest.raises(ConfigError, match='^multi_grid must have 2 values for '
                                        'model_variant=' + variant) as err:
    _build(variant, multi_grid=(1, 2, 4))
  assert err.value.fields == ('ModelOptions.multi_grid',
                              'ModelOptions.model_variant')


def test_strided_unit_strides_in_its_second_conv():
  graph, _, _, _ = _build('resnet_v1_18', output_stride=32)
  prefix = 'resnet_v1_18/block2/unit_2/%s/' % UNIT
  strides = {conv: op.get_attr('strides')[1]
             for op in graph.get_operations() if op.type == 'Conv2D'
             for conv in ('conv1', 'conv2')
             if op.name.startswith(prefix + conv + '/')}
  assert strides == {'conv1': 1, 'conv2': 2}


def test_resnet_v1_18_pads_with_127_5_but_subtracts_imagenet_mean():
  """The original's mean-pixel table gives 127.5 to every variant but
  resnet_v1_50/101, while resnet_v1_18 subtracts the ImageNet mean: its
  padding is not 0 after normalisation. Ours does the same."""
  plain, beta = (registry.get(v) for v in VARIANTS)
  assert plain.mean_pixel == beta.mean_pixel == (127.5, 127.5, 127.5)
  with tf.Graph().as_default(), tf.Session() as sess:
    pad = tf.constant([[[plain.mean_pixel]]], tf.float32)
    plain_pad, beta_pad = sess.run([plain.normalize(pad),
                                    beta.normalize(pad)])
  np.testing.assert_allclose(
      plain_pad[0, 0, 0],
      127.5 - np.array(registry.IMAGENET_MEAN_RGB, np.float32), atol=1e-5)
  np.testing.assert_allclose(beta_pad, 0.0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('variant', VARIANTS)
def test_trains_two_steps_on_cpu(variant):
  """Two training steps at output stride 8 with ASPP rates, decoder and a
  two-value multi_grid."""
  options = ModelOptions(num_classes=3, model_variant=variant,
                         crop_size=(33, 33), output_stride=8,
                         atrous_rates=(12, 24, 36), multi_grid=(1, 2),
                         decoder_output_stride=(4,)).validate()
  # Both variants' variables are under resnet_v1_18/.
  losses, step, (before, after) = tt.train_steps(
      options, 'resnet_v1_18/block4/unit_2/%s/conv2/weights' % UNIT)
  assert step == 2 and np.isfinite(losses).all()
  assert np.abs(after - before).max() > 0
