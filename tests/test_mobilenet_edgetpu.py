"""Tests of the mobilenet_edgetpu backbone (EdgeTPU-DeepLab and -slim).

Its variables are checked against the original's manifests in
test_manifests.py and its numbers against the original's exported graph in
test_reference_numeric.py; these tests cover the registry entry, the layer
plan, the block structure, the error cases and two training steps.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError, ModelOptions
from deeplab_train.model import deeplab
from deeplab_train.model import layers
from deeplab_train.model import mobilenet_edgetpu
from deeplab_train.model import registry

VARIANT = 'mobilenet_edgetpu'


def _build(crop=33, output_stride=16, depth_multiplier=0.25, batch=1):
  """The backbone alone in a fresh graph; (graph, features, end_points)."""
  backbone = registry.get(VARIANT)
  options = ModelOptions(model_variant=VARIANT, output_stride=output_stride,
                         depth_multiplier=depth_multiplier)
  graph = tf.Graph()
  with graph.as_default(), layers.recording():
    images = tf.placeholder(tf.float32, [batch, crop, crop, 3])
    features, end_points = backbone.build(
        backbone.normalize(images), options, True, True, 4e-5)
  return graph, features, end_points


def test_registry_entry():
  backbone = registry.get(VARIANT)
  assert VARIANT in registry.known_variants()
  assert backbone.scope == 'MobilenetEdgeTPU'
  assert backbone.mean_pixel == registry.INCEPTION_MEAN_PIXEL
  assert backbone.normalize is registry.zero_mean_unit_range
  assert backbone.default_weight_decay == pytest.approx(4e-5)
  # The original defines no decoder end points for this variant.
  assert backbone.decoder_end_points == {}


def test_depths_round_to_eight_whatever_the_multiplier():
  # The slim variant (0.75) of the model zoo.
  assert [mobilenet_edgetpu.scaled_depth(d, 0.75)
          for d in (32, 16, 48, 96, 160, 192, 1280)] == (
              [24, 16, 40, 72, 120, 144, 960])
  assert mobilenet_edgetpu.scaled_depth(16, 0.25) == 8


def test_layer_plan_output_stride_16():
  plan = mobilenet_edgetpu.layer_strides_and_rates(16)
  # Stem, 22 blocks, Conv_1.
  assert len(plan) == 24
  # expanded_conv_17 (plan[18]) would reach stride 32: it runs at stride 1
  # and the later layers at rate 2.
  assert plan[:18] == [(2, 1)] + [(b.stride, 1) for b in
                                  mobilenet_edgetpu.BLOCKS[:17]]
  assert plan[18] == (1, 1)
  assert plan[19:] == [(1, 2)] * 5
  assert np.prod([s for s, _ in plan]) == 16


def test_layer_plan_output_stride_8_and_none():
  plan = mobilenet_edgetpu.layer_strides_and_rates(8)
  assert np.prod([s for s, _ in plan]) == 8
  assert plan[10] == (1, 1)            # expanded_conv_9 drops stride 2
  assert plan[11:18] == [(1, 2)] * 7   # expanded_conv_10 .. 16
  assert plan[18] == (1, 2)            # expanded_conv_17 drops stride 2
  assert plan[19:] == [(1, 4)] * 5
  plan = mobilenet_edgetpu.layer_strides_and_rates(None)
  assert np.prod([s for s, _ in plan]) == 32
  assert {r for _, r in plan} == {1}


def test_output_stride_below_8_is_refused():
  with pytest.raises(ConfigError, match='output_stride'):
    _build(output_stride=4)


def test_features_and_end_points():
  graph, features, end_points = _build(crop=65, output_stride=16)
  assert features.shape.as_list() == [1, 5, 5, 320]  # 1280 * 0.25
  assert end_points['layer_24'] is features
  assert end_points['layer_1'].shape.as_list() == [1, 33, 33, 8]
  # Fused blocks have no depthwise conv; the first one does not expand.
  assert 'layer_2/expansion_output' not in end_points
  assert 'layer_2/depthwise_output' not in end_points
  assert 'layer_3/expansion_output' in end_points
  assert 'layer_3/depthwise_output' not in end_points
  assert end_points['layer_11/depthwise_output'].shape.as_list()[1:3] == [
      5, 5]
  assert end_points['layer_23/output'].shape.as_list() == [1, 5, 5, 48]
  # A fused block's expansion is a full 3x3 conv.
  with graph.as_default():
    fused = tf.global_variables(
        'MobilenetEdgeTPU/expanded_conv_1/expand/weights')
  assert [v.shape.as_list() for v in fused] == [[3, 3, 8, 64]]


def test_relu_everywhere_and_residuals_as_the_original():
  # Full depth: the residuals depend on the depths (cheap, nothing runs).
  graph, _, _ = _build(depth_multiplier=1.0)
  ops = [op for op in graph.get_operations()
         if op.name.startswith('MobilenetEdgeTPU/')]
  assert not [op.name for op in ops if op.type == 'Relu6']
  # Stem, 21 expansions, 13 depthwise convs, Conv_1.
  assert len([op for op in ops if op.type == 'Relu']) == 36
  # The residual sum is the only `add` directly under a block's scope.
  added = {op.name.split('/')[1] for op in ops
           if op.type in ('Add', 'AddV2') and op.name.count('/') == 2}
  # Stride 1 and unchanged depth, except expanded_conv_13 (no residual).
  assert added == {'expanded_conv_%d' % i for i in
                   (2, 3, 4, 6, 7, 8, 10, 11, 12, 14, 15, 16, 18, 19, 20)}


def test_decoder_is_refused_with_a_clear_error():
  options = ModelOptions(num_classes=3, model_variant=VARIANT,
                         crop_size=(33, 33), depth_multiplier=0.25,
                         decoder_output_stride=(4,)).validate()
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, [1, 33, 33, 3])
    with pytest.raises(ConfigError, match=VARIANT):
      deeplab.multi_scale_logits(images, options)


def test_trains_on_cpu():
  """Two training steps of EdgeTPU-DeepLab (no decoder, ASPP without atrous
  rates) at a tiny crop."""
  import train_testing as tt  # pylint: disable=g-import-not-at-top
  options = ModelOptions(num_classes=3, model_variant=VARIANT,
                         crop_size=(33, 33), output_stride=16,
                         depth_multiplier=0.25).validate()
  losses, step, (before, after) = tt.train_steps(
      options, 'MobilenetEdgeTPU/Conv_1/weights')
  assert step == 2 and np.isfinite(losses).all()
  # The backbone is trained, not only the head.
  assert not np.allclose(before, after)
