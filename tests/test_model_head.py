"""DeepLab head and mobilenet_v2 at small crops: shapes, names, inference.

Tiny models (65x65 crops, depth_multiplier 0.25), randomly initialised.
About 400 lines on purpose: every section builds its graphs with the
`small_options` helpers at the top; split by section if it grows further.
"""
import numpy as np
import pytest

import model_testing as mt
from deeplab_train.config import ConfigError
from deeplab_train.config import ModelOptions
from deeplab_train.model import deeplab
from deeplab_train.model import head
from deeplab_train.model import layers
from deeplab_train.model import mobilenet_v2
from deeplab_train.model import registry

tf = mt.tf

CROP = (65, 65)
NUM_CLASSES = 5


def small_options(**changes):
  base = dict(num_classes=NUM_CLASSES, model_variant='mobilenet_v2',
              crop_size=CROP, output_stride=16, depth_multiplier=0.25)
  base.update(changes)
  return ModelOptions(**base)


def random_images(batch=2, seed=0, size=CROP):
  rng = np.random.default_rng(seed)
  return rng.uniform(0, 255, (batch,) + tuple(size) + (3,)).astype(np.float32)


def variable_shapes():
  return {v.op.name: v.shape.as_list() for v in tf.global_variables()}


def regularised_variable(loss):
  """Name of the variable an L2 loss tensor is computed from."""
  pending = [loss.op]
  while pending:
    op = pending.pop()
    if op.type in ('VariableV2', 'VarHandleOp'):
      return op.name
    pending.extend(t.op for t in op.inputs)
  raise AssertionError('no variable behind %s' % loss.name)


# --------------------------------------------------------------------------
# mobilenet_v2 backbone
# --------------------------------------------------------------------------
def test_layer_depths_follow_slim_rounding():
  stem, blocks = mobilenet_v2.layer_depths(1.0)
  assert stem == 32
  assert blocks == [16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96,
                    160, 160, 160, 320]
  # Below 1.0 the original rounds to 1 channel (divisible_by=1, min 1).
  stem, blocks = mobilenet_v2.layer_depths(0.25)
  assert stem == 8
  assert blocks[:3] == [4, 6, 6] and blocks[-1] == 80
  # An explicit divisible_by rounds to its multiples (min depth stays 1).
  _, blocks = mobilenet_v2.layer_depths(0.5, divisible_by=8)
  assert blocks[:3] == [8, 16, 16] and blocks[-1] == 160


@pytest.mark.parametrize('output_stride, last_rates', [
    (8, (2, 4, 4, 4)), (16, (1, 2, 2, 2)), (32, (1, 1, 1, 1))])
def test_atrous_plan(output_stride, last_rates):
  plan = mobilenet_v2.layer_strides_and_rates(output_stride)
  assert len(plan) == 18  # stem + 17 blocks
  total_stride = int(np.prod([s for s, _ in plan]))
  assert total_stride == output_stride
  # expanded_conv_13 (the last strided block) and the three after it.
  assert tuple(r for _, r in plan[14:]) == last_rates


@pytest.mark.parametrize('output_stride', [8, 16, 32])
def test_mobilenet_end_points_and_logits(output_stride):
  options = small_options(output_stride=output_stride)
  size = (CROP[0] - 1) // output_stride + 1
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, [2, CROP[0], CROP[1], 3])
    features, end_points, _ = deeplab.extract_features(images, options)
    logits = deeplab.multi_scale_logits(images, options)['semantic']
  assert end_points['layer_18'].shape.as_list() == [2, size, size, 80]
  # The decoder input: 6 channels x 6 expanded, rounded to 8 -> 40, stride 4.
  assert end_points['layer_4/depthwise_output'].shape.as_list() == (
      [2, 17, 17, 40])
  assert features.shape.as_list() == [2, size, size, 256]
  assert list(logits) == ['merged_logits']
  assert logits['merged_logits'].shape.as_list() == (
      [2, size, size, NUM_CLASSES])


def test_full_size_mobilenet_decoder_end_point_has_144_channels():
  options = small_options(depth_multiplier=1.0)
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, [1, CROP[0], CROP[1], 3])
    features, end_points, _ = deeplab.extract_features(images, options)
  assert end_points['layer_4/depthwise_output'].shape.as_list() == (
      [1, 17, 17, 144])
  assert end_points['layer_18'].shape.as_list()[-1] == 320
  assert 'layer_19' not in end_points  # no Conv_1


def test_normalize_maps_mean_pixel_to_zero():
  with tf.Graph().as_default(), tf.Session() as sess:
    values = sess.run(registry.get('mobilenet_v2').normalize(
        tf.constant([0.0, 127.5, 255.0])))
  np.testing.assert_allclose(values, [-1.0, 0.0, 1.0], atol=1e-6)


# --------------------------------------------------------------------------
# Head: ASPP, image pooling, decoder, logits
# --------------------------------------------------------------------------
def test_decoder_output_stride_4():
  options = small_options(decoder_output_stride=(4,))
  with tf.Graph().as_default():
    _, outputs, _ = mt.build_logits(options)
    shapes = variable_shapes()
  assert outputs['semantic']['merged_logits'].shape.as_list() == (
      [2, 17, 17, NUM_CLASSES])
  assert shapes['decoder/feature_projection0/weights'] == [1, 1, 40, 48]
  assert shapes['decoder/decoder_conv0_depthwise/depthwise_weights'] == (
      [3, 3, 256 + 48, 1])
  assert shapes['decoder/decoder_conv1_pointwise/weights'] == [1, 1, 256, 256]


def test_two_stage_decoder_names_its_second_stage():
  options = small_options(decoder_output_stride=(8, 4))
  with tf.Graph().as_default():
    _, outputs, _ = mt.build_logits(options)
    shapes = variable_shapes()
  assert outputs['semantic']['merged_logits'].shape.as_list()[1:3] == [17, 17]
  # Stage 0 at stride 8 (layer_7: 8 x 6 = 48 channels), stage 1 at stride 4.
  assert shapes['decoder/feature_projection0/weights'] == [1, 1, 48, 48]
  assert shapes['decoder/feature_projection0_1/weights'] == [1, 1, 40, 48]
  assert 'decoder/decoder_conv1_1_pointwise/weights' in shapes


def test_plain_convs_for_aspp_and_decoder():
  options = small_options(atrous_rates=(6, 12), decoder_output_stride=(4,),
                          aspp_with_separable_conv=False,
                          decoder_use_separable_conv=False)
  with tf.Graph().as_default():
    _, outputs, rec = mt.build_logits(options)
    shapes = variable_shapes()
  assert shapes['aspp1/weights'] == [3, 3, 80, 256]
  assert shapes['aspp2/weights'] == [3, 3, 80, 256]
  assert shapes['concat_projection/weights'] == [1, 1, 4 * 256, 256]
  assert shapes['decoder/decoder_conv0/decoder_conv0_1/weights'] == (
      [3, 3, 304, 256])
  assert shapes['decoder/decoder_conv0/decoder_conv0_2/weights'] == (
      [3, 3, 256, 256])
  assert outputs['semantic']['merged_logits'].shape.as_list()[1:3] == [17, 17]
  # Every conv `weights` in the graph is regularised, and nothing else.
  regularised = [regularised_variable(loss) for loss in
                 rec.regularization_losses]
  assert sorted(regularised) == sorted(
      n for n in shapes if n.endswith('/weights'))


def test_separable_aspp_branch_names():
  options = small_options(atrous_rates=(6, 12, 18))
  with tf.Graph().as_default():
    mt.build_logits(options)
    shapes = variable_shapes()
  for i in (1, 2, 3):
    assert shapes['aspp%d_depthwise/depthwise_weights' % i] == [3, 3, 80, 1]
    assert shapes['aspp%d_pointwise/weights' % i] == [1, 1, 80, 256]
  assert shapes['concat_projection/weights'] == [1, 1, 5 * 256, 256]


def test_no_aspp_uses_atrous_logits_branches():
  options = small_options(atrous_rates=(2, 4), aspp_with_batch_norm=False,
                          logits_kernel_size=3)
  with tf.Graph().as_default():
    _, outputs, _ = mt.build_logits(options)
    shapes = variable_shapes()
  assert shapes['logits/semantic/weights'] == [3, 3, 80, NUM_CLASSES]
  assert shapes['logits/semantic_1/weights'] == [3, 3, 80, NUM_CLASSES]
  assert not [n for n in shapes if n.startswith(('aspp', 'image_pooling'))]
  assert outputs['semantic']['merged_logits'].shape.as_list()[1:3] == [5, 5]


def test_logits_kernel_size_must_be_1_with_aspp():
  """Refused by the options' check, before any graph (it was refused while
  the graph was built, its message naming two of the three flags)."""
  options = small_options(logits_kernel_size=3)
  message = ('^logits_kernel_size=3 needs atrous_rates and '
             r'aspp_with_batch_norm=false \(as in the original')
  with pytest.raises(ConfigError, match=message):
    options.validate()
  with tf.Graph().as_default():
    with pytest.raises(ConfigError, match=message):
      mt.build_logits(options)
  small_options(atrous_rates=(2, 4), aspp_with_batch_norm=False,
                logits_kernel_size=3).validate()


def test_image_pooling_crop_size_and_stride():
  options = small_options(output_stride=8, image_pooling_crop_size=(33, 33),
                          image_pooling_stride=(2, 2))
  with tf.Graph().as_default() as graph:
    _, outputs, _ = mt.build_logits(options)
    pooled = graph.get_tensor_by_name('image_pooling/Relu:0')
  # 9x9 features, 5x5 pooling window (33 / 8), stride 2 -> 3x3.
  assert pooled.shape.as_list() == [2, 3, 3, 256]
  assert outputs['semantic']['merged_logits'].shape.as_list()[1:3] == [9, 9]


def test_image_pooling_default_is_global_mean():
  options = small_options(output_stride=8)
  with tf.Graph().as_default() as graph:
    images, _, _ = mt.build_logits(options, is_training=False,
                                   fine_tune_batch_norm=False)
    pooled = graph.get_tensor_by_name('image_pooling/Relu:0')
    features = graph.get_tensor_by_name('MobilenetV2/expanded_conv_16/output:0')
    conv_input = graph.get_operation_by_name('image_pooling/pixels').inputs[0]
    with tf.Session() as sess:
      mt.randomize_variables(sess)
      feats, pooled_in = sess.run([features, conv_input],
                                  {images: random_images()})
  assert pooled.shape.as_list() == [2, 1, 1, 256]
  np.testing.assert_allclose(pooled_in, feats.mean(axis=(1, 2), keepdims=True),
                             rtol=1e-5, atol=1e-5)


def test_dynamic_crop_size_builds_and_runs():
  options = small_options(crop_size=None, decoder_output_stride=(4,))
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, [1, None, None, 3])
    logits = deeplab.multi_scale_logits(images, options)['semantic'][
        'merged_logits']
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      value = sess.run(logits, {images: random_images(1)})
  assert value.shape == (1, 17, 17, NUM_CLASSES)


# --------------------------------------------------------------------------
# Training-graph bookkeeping
# --------------------------------------------------------------------------
def test_batch_norm_frozen_without_fine_tuning():
  with tf.Graph().as_default():
    _, _, rec = mt.build_logits(small_options(), is_training=True,
                                fine_tune_batch_norm=False)
  assert rec.update_ops == []
  assert rec.regularization_losses


def test_batch_norm_decays_per_part():
  """One update moves moving_mean by (1 - decay) * batch mean from zero."""
  with tf.Graph().as_default() as graph:
    images, _, rec = mt.build_logits(small_options(), is_training=True,
                                     fine_tune_batch_norm=True)
    checks = {'MobilenetV2/Conv': 0.997, 'aspp0': 0.9997}
    fetch = {}
    for scope in checks:
      conv = graph.get_tensor_by_name(scope + '/Conv2D:0')
      moving, = [v for v in tf.global_variables()
                 if v.op.name == scope + '/BatchNorm/moving_mean']
      fetch[scope] = (tf.reduce_mean(conv, axis=[0, 1, 2]), moving)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      feed = {images: random_images()}
      batch_means = sess.run({k: v[0] for k, v in fetch.items()}, feed)
      sess.run(rec.update_ops, feed)
      moved = sess.run({k: v[1] for k, v in fetch.items()})
  for scope, decay in checks.items():
    np.testing.assert_allclose(moved[scope], (1 - decay) * batch_means[scope],
                               rtol=1e-4, atol=1e-7)


def test_dropout_only_in_training():
  with tf.Graph().as_default() as graph:
    mt.build_logits(small_options(), is_training=False,
                    fine_tune_batch_norm=False)
    assert not [op for op in graph.get_operations()
                if op.name.startswith('concat_projection_dropout')]
  with tf.Graph().as_default() as graph:
    mt.build_logits(small_options(), is_training=True)
    assert [op for op in graph.get_operations()
            if op.name.startswith('concat_projection_dropout')]


# --------------------------------------------------------------------------
# Multi-scale logits and inference
# --------------------------------------------------------------------------
@pytest.mark.parametrize('merge_method', ['max', 'avg'])
def test_image_pyramid_merges_scales(merge_method):
  options = small_options(merge_method=merge_method)
  with tf.Graph().as_default():
    images, outputs, _ = mt.build_logits(options, image_pyramid=(0.5, 1.0),
                                         is_training=False,
                                         fine_tune_batch_norm=False)
    logits = outputs['semantic']
    assert sorted(logits) == ['logits_0.50', 'logits_1.00', 'merged_logits']
    # One set of variables for both scales.
    assert len(tf.global_variables()) == len(set(variable_shapes()))
    with tf.Session() as sess:
      mt.randomize_variables(sess)
      values = sess.run(logits, {images: random_images()})
  for value in values.values():
    assert value.shape == (2, 5, 5, NUM_CLASSES)
  merge = np.maximum if merge_method == 'max' else (
      lambda a, b: (a + b) / 2)
  np.testing.assert_allclose(
      values['merged_logits'],
      merge(values['logits_0.50'], values['logits_1.00']), rtol=1e-5,
      atol=1e-5)


def _init_and_run(fetches, images, feed_images, sess):
  mt.randomize_variables(sess)
  return sess.run(fetches, {images: feed_images})


def test_multi_scale_and_flip_inference_shapes():
  options = small_options(decoder_output_stride=(4,))
  with tf.Graph().as_default(), tf.Session() as sess:
    images = tf.placeholder(tf.float32, [2, CROP[0], CROP[1], 3])
    out = deeplab.predict_labels_multi_scale(
        images, options, eval_scales=(0.75, 1.0, 1.25),
        add_flipped_images=True)
    labels, probs = _init_and_run(
        [out['semantic'], out['semantic_prob']], images, random_images(),
        sess)
  assert labels.shape == (2,) + CROP
  assert probs.shape == (2,) + CROP + (NUM_CLASSES,)
  assert labels.min() >= 0 and labels.max() < NUM_CLASSES
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_array_equal(labels, probs.argmax(-1))


def test_single_scale_multi_scale_prediction_equals_predict_labels():
  options = small_options()
  with tf.Graph().as_default(), tf.Session() as sess:
    images = tf.placeholder(tf.float32, [2, CROP[0], CROP[1], 3])
    single = deeplab.predict_labels(images, options)['semantic']
    multi = deeplab.predict_labels_multi_scale(images, options)['semantic']
    a, b = _init_and_run([single, multi], images, random_images(), sess)
  assert a.shape == (2,) + CROP
  assert (a == b).mean() > 0.999  # ties aside, softmax keeps the argmax


def test_flipped_image_gives_flipped_prediction():
  """Flip averaging of a flipped input is the mirror of the original's."""
  options = small_options(crop_size=(65, 65))
  image = random_images(1)
  with tf.Graph().as_default(), tf.Session() as sess:
    images = tf.placeholder(tf.float32, [1, CROP[0], CROP[1], 3])
    out = deeplab.predict_labels_multi_scale(
        images, options, add_flipped_images=True)['semantic_prob']
    mt.randomize_variables(sess)
    direct = sess.run(out, {images: image})
    mirrored = sess.run(out, {images: image[:, :, ::-1]})
  np.testing.assert_allclose(direct, mirrored[:, :, ::-1], atol=1e-5)


def test_two_inference_calls_agree():
  options = small_options(decoder_output_stride=(4,))
  with tf.Graph().as_default(), tf.Session() as sess:
    images = tf.placeholder(tf.float32, [2, CROP[0], CROP[1], 3])
    prob = deeplab.predict_labels(images, options)['semantic_prob']
    feed = random_images()
    first = _init_and_run(prob, images, feed, sess)
    second = sess.run(prob, {images: feed})
  np.testing.assert_array_equal(first, second)


def test_labels_without_upsampled_logits():
  options = small_options(prediction_with_upsampled_logits=False)
  with tf.Graph().as_default(), tf.Session() as sess:
    images = tf.placeholder(tf.float32, [2, CROP[0], CROP[1], 3])
    out = deeplab.predict_labels(images, options)
    logits = tf.get_default_graph().get_tensor_by_name(
        'logits/semantic/BiasAdd:0')
    labels, raw = _init_and_run([out['semantic'], logits], images,
                                random_images(), sess)
  assert labels.shape == (2,) + CROP
  # Nearest upsampling with align_corners of a 5x5 argmax: corners match.
  coarse = raw.argmax(-1)
  np.testing.assert_array_equal(labels[:, ::16, ::16], coarse)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------
def test_unknown_model_variant_lists_known_ones():
  with tf.Graph().as_default():
    with pytest.raises(ConfigError) as err:
      mt.build_logits(small_options(model_variant='mobilenet_v9'))
  message = str(err.value)
  assert 'mobilenet_v9' in message
  for known in ('mobilenet_v2', 'xception_65', 'resnet_v1_101_beta'):
    assert known in message


def test_decoder_stride_without_end_point_is_a_clear_error():
  options = small_options(decoder_output_stride=(2,))
  with tf.Graph().as_default():
    with pytest.raises(ConfigError, match=r'^decoder_output_stride=2 .*'
                                          r'4, 8, 16'):
      mt.build_logits(options)


def test_missing_decoder_end_point_is_a_clear_error():
  options = small_options(decoder_output_stride=(4,))
  backbone = registry.get('mobilenet_v2')
  params = layers.ConvParams()
  with tf.Graph().as_default():
    features = tf.zeros([1, 5, 5, 8])
    end_points = {'layer_3': tf.zeros([1, 17, 17, 8])}
    with pytest.raises(ConfigError,
                       match=r"'layer_4/depthwise_output'.*layer_3"):
      head.refine_by_decoder(features, end_points, backbone, CROP, options,
                             params)
