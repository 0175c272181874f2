"""Tests of the xception and resnet backbones on their own (no DeepLab head).

Graph construction is cheap whatever the size, so the variable checks run at
full size against the reference manifests; the only session runs are tiny
forward passes at crop 33.
"""
import json

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError, ModelOptions
from deeplab_train.model import atrous
from deeplab_train.model import layers
from deeplab_train.model import registry


XCEPTION = ('xception_41', 'xception_65', 'xception_71')
RESNET = ('resnet_v1_50', 'resnet_v1_50_beta', 'resnet_v1_101',
          'resnet_v1_101_beta')
# Channels of the decoder end points at strides 4, 8, 16.
END_POINT_DEPTHS = {
    'xception': {4: 256, 8: 728, 16: 1024},
    'resnet': {4: 256, 8: 512, 16: 1024},
}


def _family(variant):
  return variant.split('_')[0]


def _build(variant, crop=65, batch=1, output_stride=16, multi_grid=None,
           bn_training=True, weight_decay=4e-5, **options):
  """Builds one backbone in a fresh graph on a zero image.

  Returns:
    (graph, features, end_points, recorder, images placeholder).
  """
  backbone = registry.get(variant)
  opts = ModelOptions(model_variant=variant, output_stride=output_stride,
                      multi_grid=multi_grid, **options)
  graph = tf.Graph()
  with graph.as_default(), layers.recording() as rec:
    images = tf.placeholder(tf.float32, [batch, crop, crop, 3])
    features, end_points = backbone.build(
        backbone.normalize(images), opts, True, bn_training, weight_decay)
  return graph, features, end_points, rec, images


def _variables(graph, scope):
  with graph.as_default():
    return {(v.op.name, tuple(v.shape.as_list()))
            for v in tf.global_variables(scope + '/')}


def _manifest(reference_dir, name):
  with open(reference_dir / 'manifests' / (name + '.json')) as f:
    return json.load(f)


def _manifest_variables(manifest, scope):
  return {(n, tuple(s)) for n, s in manifest['variables']
          if n.startswith(scope + '/')}


def _size(crop, stride):
  # Every strided layer pads as SAME would: ceil(crop / stride).
  return -(-crop // stride)


# --- registry -------------------------------------------------------------

def test_all_variants_registered_with_their_scope_and_normalisation():
  scopes = {'xception_41': 'xception_41', 'xception_65': 'xception_65',
            'xception_71': 'xception_71', 'resnet_v1_50': 'resnet_v1_50',
            'resnet_v1_50_beta': 'resnet_v1_50',
            'resnet_v1_101': 'resnet_v1_101',
            'resnet_v1_101_beta': 'resnet_v1_101'}
  for variant, scope in scopes.items():
    backbone = registry.get(variant)
    assert backbone.scope == scope
    plain_resnet = variant in ('resnet_v1_50', 'resnet_v1_101')
    assert backbone.mean_pixel == (registry.IMAGENET_MEAN_RGB if plain_resnet
                                   else registry.INCEPTION_MEAN_PIXEL)
    assert sorted(backbone.decoder_end_points) == [4, 8, 16]
    # The original trainer's --weight_decay default, for every family.
    assert backbone.default_weight_decay == pytest.approx(4e-5)
  assert registry.get('resnet_v1_101').decoder_end_points[16] == (
      'block3/unit_22/bottleneck_v1/conv3',)
  assert registry.get('xception_71').decoder_end_points[4] == (
      'entry_flow/block3/unit_1/xception_module/separable_conv2_pointwise',)


def test_normalisation_plain_resnet_subtracts_mean_others_scale():
  pixels = np.array([[[[0.0, 127.5, 255.0], [123.15, 115.90, 103.06]]]],
                    np.float32)
  with tf.Graph().as_default(), tf.Session() as sess:
    x = tf.constant(pixels)
    out = {v: sess.run(registry.get(v).normalize(x))
           for v in ('resnet_v1_50', 'resnet_v1_50_beta', 'xception_65')}
  mean = np.array(registry.IMAGENET_MEAN_RGB, np.float32)
  np.testing.assert_allclose(out['resnet_v1_50'], pixels - mean, atol=1e-5)
  np.testing.assert_allclose(out['resnet_v1_50'][0, 0, 1], 0.0, atol=1e-5)
  for v in ('resnet_v1_50_beta', 'xception_65'):
    np.testing.assert_allclose(out[v][0, 0, 0], [-1.0, 0.0, 1.0], atol=1e-6)
  # The mean pixel is what padding uses: it must normalise to 0.
  with tf.Graph().as_default(), tf.Session() as sess:
    for v in XCEPTION + RESNET:
      backbone = registry.get(v)
      zero = sess.run(backbone.normalize(
          tf.constant([[[backbone.mean_pixel]]], tf.float32)))
      np.testing.assert_allclose(zero, 0.0, atol=1e-5)


# --- shapes ---------------------------------------------------------------

SHAPE_CASES = (
    [(v, 16) for v in XCEPTION + RESNET] +
    [(v, os) for v in ('xception_41', 'resnet_v1_50_beta', 'resnet_v1_50')
     for os in (8, 32)])


@pytest.mark.parametrize('variant,output_stride', SHAPE_CASES)
def test_feature_and_end_point_shapes(variant, output_stride):
  crop = 65
  _, features, end_points, _, _ = _build(variant, crop=crop, batch=2,
                                         output_stride=output_stride)
  side = _size(crop, output_stride)
  assert features.shape.as_list() == [2, side, side, 2048]
  for stride, names in registry.get(variant).decoder_end_points.items():
    (name,) = names
    # Beyond output_stride the end points stay at output_stride (atrous).
    side = _size(crop, min(stride, output_stride))
    depth = END_POINT_DEPTHS[_family(variant)][stride]
    assert end_points[name].shape.as_list() == [2, side, side, depth], name


def test_even_input_sizes_give_ceil_sizes():
  for variant in ('xception_41', 'resnet_v1_50_beta'):
    _, features, end_points, _, _ = _build(variant, crop=64)
    assert features.shape.as_list()[1:3] == [4, 4]
    name = registry.get(variant).decoder_end_points[4][0]
    assert end_points[name].shape.as_list()[1:3] == [16, 16]


# --- output stride and multi-grid -----------------------------------------

def _atrous_rate(graph, scope):
  """The atrous rate of the (depthwise) conv under `scope`.

  Conv2D carries it as `dilations`; a dilated depthwise conv runs as
  SpaceToBatchND -> DepthwiseConv2dNative with the rate as block shape.
  """
  rates = []
  for op in graph.get_operations():
    if not op.name.startswith(scope + '/'):
      continue
    if op.type in ('Conv2D', 'DepthwiseConv2dNative'):
      rates.append(op.get_attr('dilations')[1])
    elif op.type == 'SpaceToBatchND':
      rates.append(int(tf.get_static_value(op.inputs[1])[0]))
  assert rates, 'no conv under %s' % scope
  return max(rates)


@pytest.mark.parametrize('output_stride,multi_grid,expected', [
    (16, None, (2, 2, 2)),
    (16, (1, 2, 4), (2, 4, 8)),
    (8, (1, 2, 4), (4, 8, 16)),
    (32, (1, 2, 4), (1, 2, 4)),
])
def test_resnet_block4_rates(output_stride, multi_grid, expected):
  graph, _, _, _, _ = _build('resnet_v1_50_beta', crop=33,
                             output_stride=output_stride,
                             multi_grid=multi_grid)
  rates = tuple(_atrous_rate(
      graph, 'resnet_v1_50/block4/unit_%d/bottleneck_v1/conv2' % i)
                for i in (1, 2, 3))
  assert rates == expected
  # Block3 is atrous only below output stride 16 (rate 2 at OS 8).
  assert _atrous_rate(graph, 'resnet_v1_50/block3/unit_2/bottleneck_v1/'
                      'conv2') == (2 if output_stride == 8 else 1)


@pytest.mark.parametrize('output_stride,multi_grid,expected', [
    (16, None, (2, 2, 2)),
    (16, (1, 2, 4), (2, 4, 8)),
    (8, (1, 2, 4), (4, 8, 16)),
])
def test_xception_exit_flow_rates(output_stride, multi_grid, expected):
  graph, _, _, _, _ = _build('xception_41', crop=33,
                             output_stride=output_stride,
                             multi_grid=multi_grid)
  prefix = 'xception_41/exit_flow/block2/unit_1/xception_module/'
  rates = tuple(_atrous_rate(graph, prefix + 'separable_conv%d_depthwise' % i)
                for i in (1, 2, 3))
  assert rates == expected
  middle = 'xception_41/middle_flow/block1/unit_1/xception_module/'
  assert _atrous_rate(graph, middle + 'separable_conv1_depthwise') == (
      2 if output_stride == 8 else 1)


def test_unit_strides_and_rates_bookkeeping():
  # Strides 2, 1, 2, 2 after a root of stride 2.
  strides = [2, 1, 2, 2]
  assert atrous.unit_strides_and_rates(strides, 16, 2, 'v') == [
      (2, 1), (1, 1), (2, 1), (2, 1)]
  assert atrous.unit_strides_and_rates(strides, 8, 2, 'v') == [
      (2, 1), (1, 1), (2, 1), (1, 1)]
  assert atrous.unit_strides_and_rates(strides, 4, 2, 'v') == [
      (2, 1), (1, 1), (1, 1), (1, 2)]
  with pytest.raises(ConfigError, match='output_stride=12.*2, 4, 8, 16'):
    atrous.unit_strides_and_rates(strides, 12, 2, 'v')


@pytest.mark.parametrize('variant', ['xception_41', 'resnet_v1_50'])
def test_bad_output_stride_and_multi_grid_are_config_errors(variant):
  # The errors name option fields; each command shows them as its flags.
  with pytest.raises(ConfigError, match='^output_stride=64 .*model_variant='
                                        + variant) as err:
    _build(variant, crop=33, output_stride=64)
  assert err.value.fields == ('ModelOptions.output_stride',
                              'ModelOptions.model_variant')
  with pytest.raises(ConfigError, match='^multi_grid must have 3 values for '
                                        'model_variant=' + variant) as err:
    _build(variant, crop=33, multi_grid=(1, 2))
  assert err.value.fields == ('ModelOptions.multi_grid',
                              'ModelOptions.model_variant')


# --- variables against the reference manifests -----------------------------

MANIFESTS = ('xception_41', 'xception_65', 'xception_71',
             'resnet_v1_50_beta', 'resnet_v1_101_beta')


@pytest.mark.parametrize('name', MANIFESTS)
def test_backbone_variables_match_manifest(reference_dir, name):
  manifest = _manifest(reference_dir, name)
  scope = registry.get(name).scope
  # Variable shapes do not depend on the crop: a small one builds faster.
  graph, _, _, rec, _ = _build(
      name, crop=65, batch=2,
      output_stride=manifest['config']['output_stride'],
      multi_grid=manifest['config']['multi_grid'])
  expected = _manifest_variables(manifest, scope)
  assert _variables(graph, scope) == expected
  # One L2 loss per conv `weights` (depthwise weights are not regularised),
  # two moving-average updates per BatchNorm.
  num_weights = sum(1 for n, _ in expected if n.endswith('/weights'))
  num_bn = sum(1 for n, _ in expected if n.endswith('/moving_mean'))
  assert len(rec.regularization_losses) == num_weights
  assert len(rec.update_ops) == 2 * num_bn
  with graph.as_default():
    trainable = {v.op.name for v in tf.trainable_variables()}
  assert not any('moving_' in n for n in trainable)


@pytest.mark.parametrize('layers_count', [50, 101])
def test_plain_resnet_has_7x7_root_instead_of_beta_root(reference_dir,
                                                        layers_count):
  scope = 'resnet_v1_%d' % layers_count
  beta = _manifest_variables(
      _manifest(reference_dir, scope + '_beta'), scope)
  graph, _, _, _, _ = _build(scope, crop=33, multi_grid=(1, 2, 4))
  plain = _variables(graph, scope)
  unit1 = scope + '/block1/unit_1/bottleneck_v1/'
  changed = lambda n: n.startswith((scope + '/conv1', unit1 + 'conv1/weights',
                                    unit1 + 'shortcut/weights'))
  assert {v for v in plain if not changed(v[0])} == {
      v for v in beta if not changed(v[0])}
  assert {v for v in plain if changed(v[0]) and v[0].endswith('weights')} == {
      (scope + '/conv1/weights', (7, 7, 3, 64)),
      (unit1 + 'conv1/weights', (1, 1, 64, 64)),
      (unit1 + 'shortcut/weights', (1, 1, 64, 256))}


def test_bn_inference_mode_records_no_updates():
  _, _, _, rec, _ = _build('xception_41', crop=33, bn_training=False)
  assert rec.update_ops == []
  assert len(rec.regularization_losses) == 45


def test_second_build_reuses_variables():
  backbone = registry.get('resnet_v1_50_beta')
  opts = ModelOptions(model_variant='resnet_v1_50_beta')
  with tf.Graph().as_default(), layers.recording() as rec:
    images = tf.zeros([1, 33, 33, 3])
    backbone.build(images, opts, True, True, 1e-4)
    count = len(tf.global_variables())
    num_losses = len(rec.regularization_losses)
    with tf.variable_scope(tf.get_variable_scope(), reuse=True):
      backbone.build(images, opts, True, True, 1e-4)
    assert len(tf.global_variables()) == count
    assert len(rec.regularization_losses) == num_losses


def test_xception_bounded_activation_uses_relu6_and_clipping():
  def pads_in_modules(graph):
    return [op.name for op in graph.get_operations()
            if op.type == 'Pad' and 'xception_module' in op.name]

  plain, _, _, _, _ = _build('xception_41', crop=33)
  graph, _, _, _, _ = _build('xception_41', crop=33,
                             use_bounded_activation=True)
  types = {op.type for op in graph.get_operations()}
  assert 'Relu6' in types and 'Relu' not in types
  assert any('clip_by_value' in op.name for op in graph.get_operations())
  # Bounded mode uses native SAME padding in the strided separable convs
  # (entry blocks 1-3; at output stride 16 the exit flow is atrous).
  assert len(pads_in_modules(plain)) == 3 and not pads_in_modules(graph)


# --- forward passes ----------------------------------------------------------

@pytest.mark.parametrize('variant', ['xception_41', 'resnet_v1_50_beta'])
def test_tiny_forward_pass_computes(variant):
  graph, features, end_points, rec, images = _build(
      variant, crop=33, batch=2, multi_grid=(1, 2, 4))
  end_point = end_points[registry.get(variant).decoder_end_points[4][0]]
  rng = np.random.RandomState(0)
  pixels = rng.uniform(0, 255, size=(2, 33, 33, 3)).astype(np.float32)
  with graph.as_default(), tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    moving = [v for v in tf.global_variables()
              if v.op.name.endswith('moving_mean')][0]
    out, low, _ = sess.run([features, end_point, rec.update_ops],
                           {images: pixels})
    moved = sess.run(moving)
  assert out.shape == (2, 3, 3, 2048) and low.shape[1:3] == (9, 9)
  assert np.isfinite(out).all() and np.isfinite(low).all()
  assert out.std() > 0
  # The two images differ, so must their features.
  assert np.abs(out[0] - out[1]).max() > 0
  # Running the update ops moved the moving mean away from its zero init.
  assert np.abs(moved).max() > 0


@pytest.mark.slow
def test_atrous_resnet_and_plain_aspp_train_on_cpu_without_onednn(tmp_path):
  """Dilated plain convolutions (resnet's atrous blocks, ASPP without
  separable convs) train where Conv2D's dilations have no CPU gradient
  kernels: TensorFlow without oneDNN."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import train_testing as tt  # pylint: disable=g-import-not-at-top
  records = tmp_path / 'records'
  tt.make_tfrecords(records, count=2)
  env = dict(tt.subprocess_env(), TF_ENABLE_ONEDNN_OPTS='0')
  proc = subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.train',
       '--train_logdir=%s' % (tmp_path / 'train'),
       '--dataset_dir=%s' % records, '--dataset=shapes',
       '--model_variant=resnet_v1_50_beta', '--output_stride=8',
       '--multi_grid=1', '--multi_grid=2', '--multi_grid=4',
       '--atrous_rates=2', '--atrous_rates=4', '--atrous_rates=6',
       '--aspp_with_separable_conv=false', '--decoder_output_stride=4',
       '--decoder_use_separable_conv=false', '--train_crop_size=33,33',
       '--train_batch_size=1', '--fine_tune_batch_norm=false',
       '--training_number_of_steps=2', '--log_steps=1',
       '--save_summaries_secs=0'],
      capture_output=True, text=True, env=env, cwd=str(tt.REPO),
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads([l for l in proc.stdout.splitlines()
                       if l.startswith('{')][-1])
  assert result['status'] == 'ok' and result['global_step'] == 2, result


# --- training with atrous rates -----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('variant', ['resnet_v1_50', 'resnet_v1_101_beta',
                                     'xception_71'])
def test_backbone_with_atrous_rates_trains_on_cpu(variant):
  """Two training steps at output stride 8 with ASPP rates and multi_grid
  (mobilenet_v2 and xception_65 train in test_training_step.py,
  resnet_v1_50_beta without oneDNN below). One variant per layout: the
  deeper resnet_v1_101 and the shallower xception_41 repeat the units of
  resnet_v1_50 and xception_65, with the same code, only more or fewer of
  them (built above: xception_41 against its manifest, resnet_v1_101's
  shapes and plain root)."""
  import train_testing as tt  # pylint: disable=g-import-not-at-top
  options = ModelOptions(num_classes=3, model_variant=variant,
                         crop_size=(33, 33), output_stride=8,
                         atrous_rates=(12, 24, 36), multi_grid=(1, 2, 4),
                         decoder_output_stride=(4,)).validate()
  # Batch norm is trained (train_steps): frozen at its initial statistics
  # (mean 0, variance 1), random weights blow up through a hundred layers
  # and the loss overflows for some initialisations.
  losses, step, (before, after) = tt.train_steps(
      options, 'logits/semantic/weights')
  assert step == 2 and np.isfinite(losses).all()
  assert not np.allclose(before, after)
