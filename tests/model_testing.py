"""Shared helpers for the model tests: manifests, graph building, variables.

The reference manifests (tests/reference/manifests/*.json) record the
variables of the original DeepLab's training graph for a configuration;
these helpers turn a manifest's config into our ModelOptions, build our
graph the same way and list what it created.
"""
import contextlib
import dataclasses
import json

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ModelOptions
from deeplab_train.config import TrainOptions
from deeplab_train.model import deeplab
from deeplab_train.model import layers
from deeplab_train.model import registry
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config
from deeplab_train.train import graph as graph_lib


# Marks a test that runs bf16 where oneDNN has native bfloat16
# instructions (skipped elsewhere).
NATIVE_BF16 = pytest.mark.skipif(
    not (session_config.onednn_kernels_on()
         and cpu_lib.onednn_native_bf16(cpu_lib.machine_cpu())),
    reason='runs bf16 where oneDNN has native bfloat16 instructions')


MANIFEST_NAMES = (
    'mobilenet_v2_os8',
    'mobilenet_v2_os16_dec4',
    'mobilenet_v3_large_seg',
    'mobilenet_v3_small_seg',
    'mobilenet_edgetpu',
    'mobilenet_edgetpu_slim',
    'xception_41',
    'xception_65',
    'xception_71',
    'xception_71_dpc',
    'resnet_v1_50_beta',
    'resnet_v1_101_beta',
    'resnet_v1_18',
    'resnet_v1_18_beta',
    'nas_pnasnet',
    'nas_hnasnet',
)


def load_manifest(reference_dir, name):
  with open(reference_dir / 'manifests' / (name + '.json')) as f:
    return json.load(f)


def _ints_or_none(values):
  # The original's flags are multi-strings (decoder_output_stride ['4']).
  return None if values is None else tuple(int(v) for v in values)


def options_from_manifest_config(config):
  """ModelOptions equivalent to a manifest's `config`."""
  return ModelOptions(
      num_classes=int(config['num_classes']),
      model_variant=config['model_variant'],
      crop_size=_ints_or_none(config['crop_size']),
      atrous_rates=_ints_or_none(config['atrous_rates']),
      output_stride=int(config['output_stride']),
      decoder_output_stride=_ints_or_none(config['decoder_output_stride']),
      multi_grid=_ints_or_none(config['multi_grid']),
      add_image_level_feature=config['add_image_level_feature'],
      aspp_with_batch_norm=config['aspp_with_batch_norm'],
      aspp_with_separable_conv=config['aspp_with_separable_conv'],
      decoder_use_separable_conv=config['decoder_use_separable_conv'],
      logits_kernel_size=int(config['logits_kernel_size']),
      depth_multiplier=float(config['depth_multiplier']),
      divisible_by=config.get('divisible_by'),
      image_pooling_crop_size=_ints_or_none(
          config.get('image_pooling_crop_size')),
      image_pooling_stride=_ints_or_none(
          config.get('image_pooling_stride', (1, 1))),
      aspp_convs_filters=int(config.get('aspp_convs_filters', 256)),
      decoder_filters=int(config.get('decoder_filters', 256)),
      aspp_with_concat_projection=config.get(
          'aspp_with_concat_projection', True),
      aspp_with_squeeze_and_excitation=config.get(
          'aspp_with_squeeze_and_excitation', False),
      image_se_uses_qsigmoid=config.get('image_se_uses_qsigmoid', False),
      decoder_use_sum_merge=config.get('decoder_use_sum_merge', False),
      decoder_output_is_logits=config.get('decoder_output_is_logits', False),
      dense_prediction_cell_config=config.get('dense_prediction_cell_config'),
      **_nas_options(config),
  ).validate()


def _nas_options(config):
  nas = config.get('nas_architecture_options') or {}
  return {key: nas[key] for key in (
      'nas_stem_output_num_conv_filters', 'nas_use_classification_head',
      'nas_remove_os32_stride') if key in nas}


def build_logits(options, batch_size=2, crop_size=None, image_pyramid=None,
                 weight_decay=0.0001, is_training=True,
                 fine_tune_batch_norm=True):
  """Builds multi_scale_logits in the current graph on a placeholder.

  Returns:
    (images placeholder, outputs dict, layers.Recorder).
  """
  crop = crop_size or options.crop_size
  images = tf.placeholder(tf.float32, [batch_size, crop[0], crop[1], 3],
                          name='images')
  with layers.recording() as rec:
    outputs = deeplab.multi_scale_logits(
        images, options, image_pyramid=image_pyramid,
        weight_decay=weight_decay, is_training=is_training,
        fine_tune_batch_norm=fine_tune_batch_norm)
  return images, outputs, rec


def build_training_graph_from_manifest(manifest, batch_size=2):
  """Our training graph for a manifest's config, in a fresh tf.Graph.

  Returns:
    (graph, outputs dict, layers.Recorder).
  """
  config = manifest['config']
  options = options_from_manifest_config(config)
  graph = tf.Graph()
  with graph.as_default():
    _, outputs, rec = build_logits(
        options, batch_size=batch_size,
        image_pyramid=config.get('image_pyramid'),
        weight_decay=config['weight_decay'],
        is_training=config['is_training'],
        fine_tune_batch_norm=config['fine_tune_batch_norm'])
  return graph, outputs, rec


class _ReadOptions:
  """ModelOptions that note each field read into `read`."""

  def __init__(self, options, read):
    self._options, self._read = options, read

  def __getattr__(self, name):
    self._read.add(name)
    return getattr(self._options, name)


@contextlib.contextmanager
def recording_backbone_options():
  """Yields a set that collects the ModelOptions fields the backbones'
  build functions read while the block runs."""
  read = set()
  entries = dict(registry._REGISTRY)  # pylint: disable=protected-access

  def recording(build):
    def build_reading(images, options, *args, **kwargs):
      return build(images, _ReadOptions(options, read), *args, **kwargs)
    return build_reading
  for name, backbone in entries.items():
    registry._REGISTRY[name] = dataclasses.replace(  # pylint: disable=protected-access
        backbone, build=recording(backbone.build))
  try:
    yield read
  finally:
    registry._REGISTRY.update(entries)  # pylint: disable=protected-access


def variable_shapes(graph):
  """{(name, shape)} of the graph's global variables, global_step aside."""
  with graph.as_default():
    return {(v.op.name, tuple(v.shape.as_list()))
            for v in tf.global_variables() if v.op.name != 'global_step'}


def manifest_variable_shapes(manifest):
  return {(name, tuple(shape)) for name, shape in manifest['variables']}


def _scaled_random_value(rng, name, shape):
  """A value that keeps activations O(1) through a deep net."""
  leaf = name.rsplit('/', 1)[-1]
  if leaf == 'depthwise_weights':
    return rng.normal(0.0, 1.1 * np.sqrt(1.0 / np.prod(shape[:2])), shape)
  if leaf == 'weights':
    return rng.normal(0.0, 1.1 * np.sqrt(1.0 / np.prod(shape[:-1])), shape)
  if leaf in ('gamma', 'moving_variance'):
    return rng.uniform(0.8, 1.2, shape)
  return rng.normal(0.0, 0.05, shape)  # beta, biases, moving_mean


def randomize_variables(sess, seed=0):
  """Loads fan-in-scaled random values into every variable of the graph.

  Freshly initialised networks with frozen BN shrink activations to ~1e-14
  at the logits (all classes tie); these values keep them O(1) so that
  inference tests compare meaningful labels.
  """
  rng = np.random.default_rng(seed)
  feed = {}
  variables = sorted(tf.global_variables(), key=lambda v: v.op.name)
  for var in variables:
    value = _scaled_random_value(rng, var.op.name, var.shape.as_list())
    # Feeding the initializer's value input assigns it in the same run.
    feed[var.initializer.inputs[1]] = np.asarray(
        value, var.dtype.as_numpy_dtype)
  sess.run([var.initializer for var in variables], feed)


def layer_output_and_gradients(build_layer, shape, mixed_precision=None):
  """([y, dy/dx, dy/dweights], graph) of the layer with one trainable
  variable that `build_layer(x)` builds on a fixed random input of
  `shape`, with a fixed random upstream gradient.

  With `mixed_precision` ('none', 'bf16') the session is made for that
  mode, x and the upstream gradient are variables (grappler folds
  constants' ops before the bf16 rewrite) and the values are fetched
  through copies (the rewrite leaves fetched ops in float32).
  """
  rng = np.random.RandomState(0)
  x_value = rng.uniform(-2, 2, shape).astype(np.float32)
  in_session = mixed_precision is not None
  tensor = ((lambda value: tf.Variable(value, trainable=False))
            if in_session else tf.constant)
  with tf.Graph().as_default() as graph:
    tf.set_random_seed(1)
    x = tensor(x_value)
    y = build_layer(x)
    (weights,) = tf.trainable_variables()
    dy = tensor(rng.uniform(-1, 1, y.shape.as_list()).astype(np.float32))
    fetches = [y] + tf.gradients(y, [x, weights], dy)
    config = None
    if in_session:
      fetches = [tf.identity(t) for t in fetches]
      config = session_config.make_session_config(
          mixed_precision=mixed_precision)
    with tf.Session(config=config) as sess:
      sess.run(tf.global_variables_initializer())
      return sess.run(fetches), graph


def trained_bn_layer_run(build_layer, x_value, rng,
                         mixed_precision='none'):
  """Runs layers with trained BN that `build_layer(x)` builds (inside
  layers.recording()) on x, a variable holding `x_value` (grappler folds
  constants' ops before the bf16 rewrite), in a new graph, with an
  upstream gradient drawn from `rng` after the build and the BN
  parameters then drawn from it too (far from their initial values).

  Returns (the trainable variables' names, sorted; [y, dy/dx,
  dy/dvariables..., the moving averages after one update]; the graph;
  {name: value} of the trainable variables; the upstream gradient), the
  values fetched through copies (the bf16 rewrite leaves fetched ops in
  float32) from a session for `mixed_precision`.
  """
  with tf.Graph().as_default() as graph:
    tf.set_random_seed(2)
    x = tf.Variable(x_value, trainable=False)
    with layers.recording() as rec:
      y = build_layer(x)
    variables = sorted(tf.trainable_variables(), key=lambda v: v.op.name)
    dy_value = rng.uniform(-1, 1, y.shape.as_list()).astype(np.float32)
    dy = tf.Variable(dy_value, trainable=False)
    grads = tf.gradients(y, [x] + variables, dy)
    moving = sorted((v for v in tf.global_variables() if 'moving' in v.op.name),
                    key=lambda v: v.op.name)
    fetches = [tf.identity(t) for t in [y] + grads]
    config = session_config.make_session_config(
        mixed_precision=mixed_precision)
    with tf.Session(config=config) as sess:
      sess.run(tf.global_variables_initializer())
      for v in variables:
        if 'BatchNorm' in v.op.name:
          v.load(rng.uniform(0.5, 2.0, v.shape.as_list()), sess)
      values = sess.run(fetches)
      params = dict(zip([v.op.name for v in variables],
                        sess.run(variables)))
      sess.run(list(rec.update_ops))
      values += sess.run(moving)
  return ([v.op.name for v in variables], values, graph, params, dy_value)


def assert_same_output_and_gradients(expected, got, tolerance=1e-5):
  """Output and gradients (layer_output_and_gradients) equal, each within
  `tolerance` times its largest magnitude."""
  for label, a, b in zip(['output', 'd/dx', 'd/dweights'], expected, got):
    assert a.shape == b.shape, label
    scale = float(np.max(np.abs(a)))
    np.testing.assert_allclose(b, a, rtol=0, atol=tolerance * scale,
                               err_msg=label)


def small_training_graph(model_variant='mobilenet_v2', output_stride=8,
                         fine_tune_batch_norm=True, mixed_precision='none',
                         use_xla=False, **model_fields):
  """The TrainingGraph of a small network (crop 33, 3 classes, batch 2) on
  CPU towers, fed zero images; `model_fields` go to ModelOptions."""
  model = ModelOptions(
      num_classes=3, model_variant=model_variant, crop_size=(33, 33),
      output_stride=output_stride, **model_fields).validate()
  train = TrainOptions(
      train_batch_size=2, training_number_of_steps=10,
      fine_tune_batch_norm=fine_tune_batch_norm, clone_on_cpu=True,
      mixed_precision=mixed_precision, use_xla=use_xla).validate()

  def input_fn():
    return {'image': tf.zeros([2, 33, 33, 3]),
            'label': tf.zeros([2, 33, 33, 1], tf.int32)}
  return graph_lib.build_training_graph(model, train, ignore_label=255,
                                        input_fn=input_fn)


def mobilenet_v2_os8_training_graph(mixed_precision, use_xla=False):
  """small_training_graph of mobilenet_v2 OS8, depth multiplier 0.25,
  trained BN."""
  return small_training_graph(mixed_precision=mixed_precision,
                              use_xla=use_xla, depth_multiplier=0.25)
