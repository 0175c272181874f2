"""MobileNetV3 backbones and the head options the model zoo builds them with.

The variables are checked against the original's manifests in
test_manifests.py and the outputs against its exported graph in
test_reference_numeric.py; here: the backbones' strides, end points and
activations, what each head option computes (squeeze-and-excitation gate,
no concat projection, sum-merge decoder giving the logits), the option
checks, and two training steps of each variant at a tiny crop.
"""
import numpy as np
import pytest

import model_testing as mt
from deeplab_train.config import ConfigError
from deeplab_train.config import ModelOptions
from deeplab_train.model import deeplab
from deeplab_train.model import head
from deeplab_train.model import layers
from deeplab_train.model import mobilenet_v3
from deeplab_train.model import registry

tf = mt.tf

VARIANTS = ('mobilenet_v3_large_seg', 'mobilenet_v3_small_seg')
CROP = (65, 65)
NUM_CLASSES = 3


def zoo_options(variant, **changes):
  """The model zoo's Cityscapes configuration, at a tiny crop."""
  base = dict(
      num_classes=NUM_CLASSES, model_variant=variant, crop_size=CROP,
      output_stride=32, decoder_output_stride=(8,),
      image_pooling_crop_size=CROP, image_pooling_stride=(4, 5),
      aspp_convs_filters=16, aspp_with_concat_projection=False,
      aspp_with_squeeze_and_excitation=True, image_se_uses_qsigmoid=True,
      decoder_use_sum_merge=True, decoder_filters=NUM_CLASSES,
      decoder_output_is_logits=True)
  base.update(changes)
  return ModelOptions(**base)


def random_images(batch=1, seed=0, size=CROP):
  rng = np.random.default_rng(seed)
  return rng.uniform(0, 255, (batch,) + tuple(size) + (3,)).astype(np.float32)


def run(fetches, feed=None, seed=0):
  """Runs `fetches` in the default graph with random O(1) variables."""
  with tf.Session() as sess:
    mt.randomize_variables(sess, seed=seed)
    return sess.run(fetches, feed)


# --------------------------------------------------------------------------
# Backbones
# --------------------------------------------------------------------------
def test_activations():
  x = np.array([-4.0, -3.0, -1.5, 0.0, 1.0, 3.0, 5.0], np.float32)
  with tf.Graph().as_default():
    swish, gate = run([mobilenet_v3.hard_swish(tf.constant(x)),
                       layers.hard_sigmoid(tf.constant(x))])
  relu6 = np.clip(x + 3, 0, 6)
  np.testing.assert_allclose(swish, x * relu6 / 6, rtol=1e-6)
  # The original's gates multiply by 0.16667, not by 1/6.
  np.testing.assert_allclose(gate, relu6 * 0.16667, rtol=1e-6)
  assert gate[-1] == np.float32(6 * 0.16667)


@pytest.mark.parametrize('variant', VARIANTS)
def test_decoder_end_points_sit_at_their_stride(variant):
  backbone = registry.get(variant)
  options = zoo_options(variant)
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, (1,) + CROP + (3,))
    features, end_points = backbone.build(
        backbone.normalize(images), options, False, False, 4e-5)
  assert features.shape.as_list()[1:3] == [3, 3]
  for stride, names in backbone.decoder_end_points.items():
    for name in names:
      side = head.scale_dimension(CROP[0], 1.0 / stride)
      assert end_points[name].shape.as_list()[1:3] == [side, side], name


@pytest.mark.parametrize('variant,last_layer,channels', [
    ('mobilenet_v3_large_seg', 'layer_17', 480),
    ('mobilenet_v3_small_seg', 'layer_13', 288),
])
def test_backbone_ends_at_the_halved_conv_1(variant, last_layer, channels):
  backbone = registry.get(variant)
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, (1,) + CROP + (3,))
    features, end_points = backbone.build(
        images, zoo_options(variant), False, False, 4e-5)
    names = {v.op.name for v in tf.global_variables()}
  assert end_points[last_layer] is features
  assert features.shape.as_list()[-1] == channels
  assert 'MobilenetV3/Conv_1/weights' in names
  assert not [n for n in names if not n.startswith('MobilenetV3/')]


@pytest.mark.parametrize('variant', VARIANTS)
def test_output_stride_makes_atrous_convs_with_the_same_variables(variant):
  backbone = registry.get(variant)
  shapes = {}
  for output_stride in (32, 16, 8):
    with tf.Graph().as_default():
      images = tf.placeholder(tf.float32, (1,) + CROP + (3,))
      features, _ = backbone.build(
          images, zoo_options(variant, output_stride=output_stride,
                              decoder_output_stride=(4,)), False, False, 4e-5)
      shapes[output_stride] = mt.variable_shapes(tf.get_default_graph())
      side = head.scale_dimension(CROP[0], 1.0 / output_stride)
      assert features.shape.as_list()[1:3] == [side, side]
  assert shapes[32] == shapes[16] == shapes[8]


def test_depth_multiplier_rounds_to_multiples_of_eight():
  options = zoo_options('mobilenet_v3_small_seg', depth_multiplier=0.5)
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, (1,) + CROP + (3,))
    registry.get('mobilenet_v3_small_seg').build(
        images, options, False, False, 4e-5)
    shapes = dict(mt.variable_shapes(tf.get_default_graph()))
  assert shapes['MobilenetV3/Conv/weights'] == (3, 3, 3, 8)
  assert shapes['MobilenetV3/Conv_1/weights'] == (1, 1, 24, 144)
  # The expansion is 6x the actual input channels (24 -> 144).
  assert shapes['MobilenetV3/expanded_conv_10/expand/weights'] == (
      1, 1, 24, 144)
  assert all(shape[-1] % 8 == 0 for name, shape in shapes.items()
             if name.endswith('/weights'))


def test_squeeze_excite_gates_each_channel():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 4, 4, 24)).astype(np.float32)
  params = mobilenet_v3.backbone_params(4e-5, False)
  with tf.Graph().as_default():
    with layers.recording() as rec:
      out = mobilenet_v3.squeeze_excite(tf.constant(x), params)
    variables = {v.op.name: v for v in tf.global_variables()}
    result, values = run([out, variables])
  assert len(rec.regularization_losses) == 2  # both weights, no biases
  w0 = values['squeeze_excite/Conv/weights'][0, 0]
  b0 = values['squeeze_excite/Conv/biases']
  w1 = values['squeeze_excite/Conv_1/weights'][0, 0]
  b1 = values['squeeze_excite/Conv_1/biases']
  assert w0.shape == (24, 8)  # 24 / 4 = 6, rounded up to a multiple of 8
  squeezed = np.maximum(x.mean(axis=(1, 2)) @ w0 + b0, 0)
  gate = np.clip(squeezed @ w1 + b1 + 3, 0, 6) * 0.16667
  np.testing.assert_allclose(result, x * gate[:, None, None, :], rtol=1e-4,
                             atol=1e-5)


# --------------------------------------------------------------------------
# Head options
# --------------------------------------------------------------------------
@pytest.mark.parametrize('qsigmoid', [True, False])
def test_image_pooling_gates_the_aspp_output(qsigmoid):
  """With squeeze-and-excitation, the ASPP output is aspp0 times the gate
  computed from the pooled features (no concat, no projection)."""
  rng = np.random.default_rng(2)
  features = rng.normal(size=(2, 3, 3, 8)).astype(np.float32)
  options = zoo_options('mobilenet_v3_small_seg', crop_size=None,
                        image_pooling_crop_size=None,
                        image_se_uses_qsigmoid=qsigmoid)
  with tf.Graph().as_default():
    params = head.head_params(options, 4e-5, bn_training=False)
    out = head.aspp(tf.constant(features), options, params)
    variables = {v.op.name: v for v in tf.global_variables()}
    result, values = run([out, variables])
  assert not [n for n in values if n.startswith('concat_projection')]
  assert 'image_pooling/biases' in values
  assert not [n for n in values if n.startswith('image_pooling/BatchNorm')]
  bn = {k: values['aspp0/BatchNorm/' + k]
        for k in ('gamma', 'beta', 'moving_mean', 'moving_variance')}
  aspp0 = features @ values['aspp0/weights'][0, 0]
  aspp0 = ((aspp0 - bn['moving_mean']) / np.sqrt(bn['moving_variance'] + 1e-5)
           * bn['gamma'] + bn['beta'])
  aspp0 = np.maximum(aspp0, 0)
  pooled = features.mean(axis=(1, 2))
  logit = pooled @ values['image_pooling/weights'][0, 0] + values[
      'image_pooling/biases']
  if qsigmoid:
    gate = np.clip(logit + 3, 0, 6) * 0.16667
  else:
    gate = 1 / (1 + np.exp(-logit))
  assert result.shape == (2, 3, 3, 16)
  np.testing.assert_allclose(result, aspp0 * gate[:, None, None, :],
                             rtol=1e-4, atol=1e-5)


def test_without_concat_projection_aspp_keeps_the_concatenation():
  options = zoo_options('mobilenet_v3_small_seg',
                        aspp_with_squeeze_and_excitation=False,
                        image_se_uses_qsigmoid=False, atrous_rates=(1, 2))
  with tf.Graph().as_default():
    features = tf.placeholder(tf.float32, [1, 3, 3, 8])
    params = head.head_params(options, 4e-5, bn_training=False)
    out = head.aspp(features, options, params,
                    dropout=lambda x: x * 0.0)  # would show if applied
    names = {v.op.name for v in tf.global_variables()}
    result = run(out, {features: np.ones([1, 3, 3, 8], np.float32)})
  # image pooling + aspp0 + two atrous branches, 16 channels each.
  assert out.shape.as_list() == [1, 3, 3, 64]
  assert not [n for n in names if n.startswith('concat_projection')]
  # The dropout belongs to concat_projection: without it, none.
  assert np.abs(result).sum() > 0


def test_training_graph_has_no_dropout_without_concat_projection():
  with tf.Graph().as_default() as graph:
    mt.build_logits(zoo_options('mobilenet_v3_small_seg'), batch_size=1)
  assert not [op for op in graph.get_operations()
              if 'dropout' in op.name.lower()]


def test_sum_merge_decoder_output_is_the_sum_of_two_convs():
  """decoder_conv0(upsampled ASPP) + feature_projection0(end point), both
  1x1 with biases and nothing else when the decoder gives the logits."""
  rng = np.random.default_rng(3)
  options = zoo_options('mobilenet_v3_small_seg')
  backbone = registry.get('mobilenet_v3_small_seg')
  side = head.scale_dimension(CROP[0], 1.0 / 8)
  aspp = rng.normal(size=(1, 3, 3, 16)).astype(np.float32)
  low = rng.normal(size=(1, side, side, 88)).astype(np.float32)
  with tf.Graph().as_default():
    params = head.head_params(options, 4e-5, bn_training=False)
    out = head.refine_by_decoder(
        tf.constant(aspp), {'layer_4/depthwise_output': tf.constant(low)},
        backbone, CROP, options, params)
    upsampled = head.resize_bilinear(tf.constant(aspp), [side, side])
    variables = {v.op.name: v for v in tf.global_variables()}
    result, up, values = run([out, upsampled, variables])
  assert sorted(values) == [
      'decoder/decoder_conv0/biases', 'decoder/decoder_conv0/weights',
      'decoder/feature_projection0/biases',
      'decoder/feature_projection0/weights']
  conv = up @ values['decoder/decoder_conv0/weights'][0, 0] + values[
      'decoder/decoder_conv0/biases']
  projection = low @ values['decoder/feature_projection0/weights'][0, 0] + (
      values['decoder/feature_projection0/biases'])
  assert result.shape == (1, side, side, NUM_CLASSES)
  np.testing.assert_allclose(result, conv + projection, rtol=1e-4, atol=1e-5)


def test_sum_merge_with_separable_conv_and_batch_norm():
  """Without decoder_output_is_logits the sum merge's conv is DeepLab's
  separable conv with BN and ReLU; the projection has decoder_filters."""
  options = zoo_options('mobilenet_v3_small_seg', decoder_filters=32,
                        decoder_output_is_logits=False)
  with tf.Graph().as_default() as graph:
    _, outputs, _ = mt.build_logits(options, batch_size=1)
    shapes = dict(mt.variable_shapes(graph))
  decoder = {n: s for n, s in shapes.items() if n.startswith('decoder/')}
  assert decoder['decoder/feature_projection0/weights'] == (1, 1, 88, 32)
  assert decoder['decoder/decoder_split_sep_conv0_depthwise/'
                 'depthwise_weights'] == (3, 3, 16, 1)
  assert decoder['decoder/decoder_split_sep_conv0_pointwise/weights'] == (
      1, 1, 16, 32)
  assert 'decoder/decoder_split_sep_conv0_pointwise/BatchNorm/gamma' in decoder
  assert not [n for n in decoder if 'decoder_conv' in n]
  # The logits conv follows as usual.
  assert shapes['logits/semantic/weights'] == (1, 1, 32, NUM_CLASSES)
  merged = outputs['semantic']['merged_logits']
  assert merged.shape.as_list() == [1, 9, 9, NUM_CLASSES]


def test_decoder_output_is_logits_names_them_semantic():
  with tf.Graph().as_default() as graph:
    images = tf.placeholder(tf.float32, (1,) + CROP + (3,))
    outputs = deeplab.multi_scale_logits(
        images, zoo_options('mobilenet_v3_large_seg'))
    names = {v.op.name for v in tf.global_variables()}
    semantic = graph.get_tensor_by_name('semantic:0')
  assert not [n for n in names if n.startswith('logits/')]
  assert semantic.shape.as_list() == [1, 9, 9, NUM_CLASSES]
  logits = outputs['semantic']['merged_logits']
  assert logits.shape.as_list() == [1, 9, 9, NUM_CLASSES]


def test_inference_labels_at_the_input_size():
  options = zoo_options('mobilenet_v3_small_seg')
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, (2,) + CROP + (3,))
    labels = deeplab.predict_labels(images, options)['semantic']
    first, second = (run(labels, {images: random_images(2)})
                     for _ in range(2))
  assert first.shape == (2,) + CROP
  assert first.max() < NUM_CLASSES
  np.testing.assert_array_equal(first, second)


# --------------------------------------------------------------------------
# Option checks
# --------------------------------------------------------------------------
@pytest.mark.parametrize('changes,field', [
    (dict(decoder_output_stride=None), 'decoder_use_sum_merge'),
    (dict(decoder_output_stride=None, decoder_use_sum_merge=False),
     'decoder_output_is_logits'),
    (dict(decoder_filters=NUM_CLASSES + 1), 'decoder_filters'),
    (dict(add_image_level_feature=False), 'add_image_level_feature'),
    (dict(aspp_with_batch_norm=False), 'aspp_with_batch_norm'),
    (dict(aspp_with_squeeze_and_excitation=False),
     'image_se_uses_qsigmoid'),
    (dict(atrous_rates=(6, 12)), 'atrous_rates'),
])
def test_impossible_combinations_are_config_errors(changes, field):
  with pytest.raises(ConfigError) as error:
    zoo_options('mobilenet_v3_large_seg', **changes).validate()
  assert field in str(error.value)
  assert any(f.endswith('.' + field) for f in error.value.fields)


def test_zoo_options_are_valid():
  for variant in VARIANTS:
    zoo_options(variant).validate()
  # The projection may go without squeeze-and-excitation (and any rates).
  ModelOptions(aspp_with_concat_projection=False,
               atrous_rates=(6, 12)).validate()


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize('variant', VARIANTS)
def test_trains_two_steps_on_cpu(variant):
  import train_testing as tt  # pylint: disable=g-import-not-at-top
  losses, step, (before, after) = tt.train_steps(
      zoo_options(variant).validate(), 'decoder/decoder_conv0/weights')
  assert step == 2 and np.isfinite(losses).all()
  assert not np.allclose(before, after)
