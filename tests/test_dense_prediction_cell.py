"""The dense prediction cell (DPC): the cell against a numpy reference, its
option (validation, JSON round trip), --dense_prediction_cell_json, and
training, eval, vis and export of a tiny network with the model zoo's cell.

The variables of the full xception_71 + DPC network are checked against the
original's manifest in test_manifests.py (xception_71_dpc).
"""
import json
import os
import pickle
import re

from absl import flags
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import eval_testing as et
import model_testing as mt
import train_testing as tt
from deeplab_train import config
from deeplab_train.cli import common_flags
from deeplab_train.cli import eval as eval_cli
from deeplab_train.cli import export as export_cli
from deeplab_train.cli import train as train_cli
from deeplab_train.cli import vis as vis_cli
from deeplab_train.export import freeze
from deeplab_train.model import dense_prediction_cell as dpc
from deeplab_train.model import layers
from deeplab_train.runtime import run as run_lib

ZOO_CELL_NAME = 'dense_prediction_cell_branch5_top1_cityscapes.json'
ORIGINAL_PATH = 'deeplab/core/' + ZOO_CELL_NAME


@pytest.fixture(scope='module')
def zoo_cell(reference_dir):
  """The model zoo's cell as the original's package has it."""
  with open(reference_dir / ZOO_CELL_NAME) as f:
    return json.load(f)


# A cell with every kind of operation: pyramid pooling (two grids), a 1x1
# conv, non-square kernels and rates, inputs from earlier operations.
MIXED_CELL = [
    {'op': 'pyramid_pooling', 'grid_size': [1, 1], 'input': -1},
    {'op': 'conv', 'kernel': [3, 1], 'rate': [2, 3], 'input': 0},
    {'op': 'conv', 'kernel': 1, 'input': -1},
    {'op': 'conv', 'kernel': 3, 'rate': [1, 4], 'input': 2},
    {'op': 'pyramid_pooling', 'grid_size': [2, 2], 'input': 3},
]


# --- the cell against numpy -------------------------------------------------


def _np_depthwise(x, weights, rate):
  """SAME, stride-1 depthwise conv with atrous rate (rh, rw), NHWC."""
  kh, kw = weights.shape[:2]
  pad_h, pad_w = (kh - 1) * rate[0], (kw - 1) * rate[1]
  padded = np.pad(x, [(0, 0), (pad_h // 2, pad_h - pad_h // 2),
                      (pad_w // 2, pad_w - pad_w // 2), (0, 0)])
  height, width = x.shape[1:3]
  out = np.zeros_like(x)
  for i in range(kh):
    for j in range(kw):
      window = padded[:, i * rate[0]:i * rate[0] + height,
                      j * rate[1]:j * rate[1] + width]
      out += window * weights[i, j, :, 0]
  return out


class _NumpyCell:
  """The cell in numpy (inference: BN from the moving statistics)."""

  def __init__(self, values, crop, output_stride):
    self.values = values
    self.crop = crop
    self.output_stride = output_stride

  def _bn_relu(self, x, scope):
    v = lambda name: self.values['%s/BatchNorm/%s' % (scope, name)]
    y = (x - v('moving_mean')) / np.sqrt(v('moving_variance') + 1e-5)
    return np.maximum(y * v('gamma') + v('beta'), 0.0)

  def _conv1x1(self, x, scope):
    return self._bn_relu(x @ self.values[scope + '/weights'][0, 0], scope)

  def _pyramid_pooling(self, x, grid, scope):
    # The pooled map is 1x1 for the grids used here: the bilinear resize
    # back is a broadcast.
    kernel = [int((side - 1) / (self.output_stride * g)) + 1
              for side, g in zip(self.crop, grid)]
    assert list(x.shape[1:3]) == kernel
    pooled = self._conv1x1(x.mean(axis=(1, 2), keepdims=True), scope)
    return np.broadcast_to(pooled, x.shape[:3] + pooled.shape[3:])

  def __call__(self, features, cell):
    multiplier = 16 // self.output_stride
    outputs = []
    for index, operation in enumerate(cell):
      x = features if operation['input'] < 0 else outputs[operation['input']]
      scope = 'meta_architecture/branch%d' % index
      if operation['op'] == 'pyramid_pooling':
        outputs.append(self._pyramid_pooling(x, operation['grid_size'],
                                             scope))
      elif operation['kernel'] in (1, [1, 1]):
        outputs.append(self._conv1x1(x, scope))
      else:
        rate = [r * multiplier for r in operation['rate']]
        x = _np_depthwise(x, self.values[scope + '_depthwise/'
                                         'depthwise_weights'], rate)
        x = self._bn_relu(x, scope + '_depthwise')
        outputs.append(self._conv1x1(x, scope + '_pointwise'))
    return self._conv1x1(np.concatenate(outputs, axis=3),
                         'meta_architecture/concat_projection')


def _cell_outputs(cell, features, output_stride, crop):
  """(our cell's output on `features`, numpy's, {variable: shape})."""
  options = config.ModelOptions(
      output_stride=output_stride, crop_size=crop,
      dense_prediction_cell_config=cell).validate()
  with tf.Graph().as_default():
    x = tf.constant(features)
    y = dpc.build_cell(x, options, weight_decay=4e-5)
    with tf.Session() as sess:
      mt.randomize_variables(sess)
      got, values = sess.run((y, {v.op.name: v for v in
                                  tf.global_variables()}))
  want = _NumpyCell(values, crop, output_stride)(features, cell)
  return got, want, {name: v.shape for name, v in values.items()}


@pytest.mark.parametrize('output_stride', [16, 8])
def test_model_zoo_cell_matches_numpy(zoo_cell, output_stride):
  """Branches read their inputs, rates (per axis, doubled at output stride
  8) and the concatenation order as the original: 17x15 features, so a
  swapped rate or a wrong input shows."""
  features = np.random.RandomState(0).normal(
      0, 1, (2, 17, 15, 8)).astype(np.float32)
  crop = tuple((side - 1) * output_stride + 1 for side in (17, 15))
  got, want, shapes = _cell_outputs(zoo_cell, features, output_stride, crop)
  assert got.shape == (2, 17, 15, 256)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert shapes['meta_architecture/branch0_depthwise/depthwise_weights'] == (
      3, 3, 8, 1)
  assert shapes['meta_architecture/branch2_pointwise/weights'] == (
      1, 1, 256, 256)
  assert shapes['meta_architecture/concat_projection/weights'] == (
      1, 1, 5 * 256, 256)


def test_every_kind_of_operation_matches_numpy():
  features = np.random.RandomState(1).normal(
      0, 1, (1, 5, 5, 4)).astype(np.float32)
  cell = [dict(op) for op in MIXED_CELL[:4]] + [
      {'op': 'pyramid_pooling', 'grid_size': [1, 1], 'input': 3}]
  got, want, shapes = _cell_outputs(cell, features, 16, (65, 65))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert shapes['meta_architecture/branch1_depthwise/depthwise_weights'] == (
      3, 1, 256, 1)
  assert shapes['meta_architecture/branch0/weights'] == (1, 1, 4, 256)


def test_pyramid_pooling_grid_resizes_back_to_the_features():
  options = config.ModelOptions(crop_size=(65, 65),
                                dense_prediction_cell_config=MIXED_CELL)
  with tf.Graph().as_default():
    x = tf.placeholder(tf.float32, [None, 5, 5, 4])
    y = dpc.build_cell(x, options.validate(), weight_decay=0.0)
    pool = tf.get_default_graph().get_tensor_by_name(
        'meta_architecture/branch4_pool:0')
    # Grid 2x2 of a 65 crop at output stride 16: 3x3 windows, 3x3 of them.
    assert pool.shape.as_list() == [None, 3, 3, 256]
    assert y.shape.as_list() == [None, 5, 5, 256]


def test_pyramid_pooling_needs_a_crop_size():
  options = config.ModelOptions(dense_prediction_cell_config=MIXED_CELL)
  with tf.Graph().as_default():
    x = tf.placeholder(tf.float32, [None, None, None, 4])
    with pytest.raises(config.ConfigError, match='crop_size'):
      dpc.build_cell(x, options.validate(), weight_decay=0.0)


def _variable_of(loss):
  """The name of the variable a regularisation loss is computed on."""
  op = loss.op
  while op.type not in ('VarHandleOp', 'VariableV2'):
    op = op.inputs[-1].op
  return op.name


def test_training_graph_dropout_regularisation_and_batch_norm(zoo_cell):
  """In training: dropout on the concatenation (before the projection),
  L2 on the pointwise and 1x1 weights only, BN updates of every conv."""
  options = config.ModelOptions(
      dense_prediction_cell_config=zoo_cell).validate()
  with tf.Graph().as_default() as graph:
    x = tf.placeholder(tf.float32, [2, 9, 9, 8])
    with layers.recording() as rec:
      dpc.build_cell(x, options, 1e-4, is_training=True, bn_training=True)
    ops = [op.name for op in graph.get_operations()]
  assert any(name.startswith('meta_architecture/concat_projection_dropout/')
             for name in ops)
  regularised = sorted(_variable_of(loss).split('/')[1]
                       for loss in rec.regularization_losses)
  assert regularised == ['branch%d_pointwise' % i for i in range(5)] + [
      'concat_projection']
  # 5 separable convs (2 BNs each) + the projection, 2 updates per BN.
  assert len(rec.update_ops) == 2 * 11
  with tf.Graph().as_default() as graph:
    x = tf.placeholder(tf.float32, [2, 9, 9, 8])
    dpc.build_cell(x, options, 1e-4)
    assert not any('dropout' in op.name for op in graph.get_operations())


def test_scales_and_flips_share_the_cell_variables():
  """Multi-scale inference builds the cell once per scale and flip, on the
  same meta_architecture variables (not meta_architecture_1, ...)."""
  from deeplab_train.model import deeplab  # pylint: disable=g-import-not-at-top
  options = _tiny_dpc_options(33)
  names = []
  for scales, flip in (((1.0,), False), ((0.5, 1.0), True)):
    with tf.Graph().as_default():
      images = tf.placeholder(tf.float32, [1, 33, 33, 3])
      deeplab.predict_labels_multi_scale(images, options, scales, flip)
      names.append(sorted(v.op.name for v in tf.global_variables()))
  assert names[0] == names[1]
  assert 'meta_architecture/branch0_depthwise/depthwise_weights' in names[0]


def test_variables_are_last_layers_for_fine_tuning():
  """initialize_last_layer=false and the last-layer gradient multiplier
  cover the cell's variables (scope meta_architecture); logits-only
  does not."""
  from deeplab_train.model import deeplab  # pylint: disable=g-import-not-at-top
  from deeplab_train.train import scopes  # pylint: disable=g-import-not-at-top
  name = 'meta_architecture/branch3_pointwise/weights'
  assert scopes.in_scopes(name, deeplab.get_extra_layer_scopes())
  assert not scopes.in_scopes(name, deeplab.get_extra_layer_scopes(True))


# --- the option --------------------------------------------------------------


def test_option_round_trips_through_json_and_stays_hashable(zoo_cell,
                                                             tmp_path):
  options = tt.tiny_model_options().replace(
      dense_prediction_cell_config=zoo_cell).validate()
  again = config.ModelOptions.from_json(options.to_json())
  assert again == options and hash(again) == hash(options)
  assert pickle.loads(pickle.dumps(options)) == options
  # Saved as the cell file has it (a list of objects), not a path.
  saved = json.loads(options.to_json())['dense_prediction_cell_config']
  assert saved == zoo_cell
  config.save_run_config(str(tmp_path), options, config.PreprocessOptions(),
                         {'name': 'x', 'num_classes': 5, 'ignore_label': 255})
  assert config.load_run_config(str(tmp_path))[0] == options
  with pytest.raises(TypeError, match='read-only'):
    options.dense_prediction_cell_config[0]['rate'] = (1, 1)
  assert tt.tiny_model_options().dense_prediction_cell_config is None


@pytest.mark.parametrize('cell,message', [
    ([], 'at least one operation'),
    ({'op': 'conv'}, 'a cell is a list of operations'),
    ([{'op': 'conv', 'kernel': 1, 'input': -1}, 'conv'],
     'operation 1 .*an operation is an object'),
    ([{'op': 'atrous', 'kernel': 3, 'rate': 2, 'input': -1}],
     "operation 0 .*unknown op 'atrous'; known: conv, pyramid_pooling"),
    ([{'op': 'conv', 'kernel': 3, 'rate': [1, 6], 'input': 0}],
     r'input must be -1 \(the backbone features\), got 0'),
    ([{'op': 'conv', 'kernel': 1, 'input': -1},
      {'op': 'conv', 'kernel': 1, 'input': 1}],
     r'operation 1 .*index of an earlier operation \(0..0\), got 1'),
    ([{'op': 'conv', 'kernel': 1}], 'input must be -1.*got None'),
    ([{'op': 'conv', 'kernel': 0, 'input': -1}],
     'kernel must be a positive integer or \\[height, width\\]'),
    ([{'op': 'conv', 'kernel': [3, 3, 3], 'rate': 1, 'input': -1}],
     'kernel must be .*got \\[3, 3, 3\\]'),
    ([{'op': 'conv', 'kernel': 3, 'input': -1}], 'rate must be .*got nothing'),
    ([{'op': 'conv', 'kernel': 3, 'rate': [6, -1], 'input': -1}],
     'rate must be a positive integer'),
    ([{'op': 'conv', 'kernel': 3, 'rate': '6', 'input': -1}], 'rate must be'),
    ([{'op': 'conv', 'kernel': 3, 'rates': [1, 6], 'input': -1}],
     "unknown key.* rates for op 'conv'"),
    ([{'op': 'pyramid_pooling', 'grid_size': [0, 2], 'input': -1}],
     'grid_size must be'),
])
def test_malformed_cells_are_named(cell, message):
  options = config.ModelOptions(dense_prediction_cell_config=cell)
  with pytest.raises(config.ConfigError, match=message) as raised:
    options.validate()
  assert raised.value.fields == ('ModelOptions.dense_prediction_cell_config',)


def test_output_stride_32_is_refused(zoo_cell):
  with pytest.raises(config.ConfigError, match='output_stride must be 4, 8 '
                     'or 16 with a dense prediction cell'):
    config.ModelOptions(output_stride=32,
                        dense_prediction_cell_config=zoo_cell).validate()


# --- --dense_prediction_cell_json --------------------------------------------


def _as_json(cell):
  return json.loads(json.dumps(cell))


def _options_from_flags(args, saved=None):
  """common_flags.model_options after parsing `args` (flags reset after)."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['prog'] + list(args))
    return common_flags.model_options(5, (65, 65), saved=saved)
  finally:
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize('name', [ORIGINAL_PATH, ZOO_CELL_NAME,
                                  './' + ORIGINAL_PATH])
def test_flag_names_the_shipped_cell(zoo_cell, name, tmp_path, monkeypatch):
  # Even where a file of that name exists, the name means the shipped copy.
  monkeypatch.chdir(tmp_path)
  (tmp_path / ZOO_CELL_NAME).write_text('not json')
  options = _options_from_flags(['--dense_prediction_cell_json=' + name])
  assert _as_json(options.dense_prediction_cell_config) == zoo_cell
  assert _options_from_flags([]).dense_prediction_cell_config is None


def test_flag_reads_any_other_path_as_a_file(tmp_path):
  path = tmp_path / 'cell.json'
  path.write_text(json.dumps(MIXED_CELL))
  options = _options_from_flags(['--dense_prediction_cell_json=%s' % path])
  assert _as_json(options.dense_prediction_cell_config) == MIXED_CELL


@pytest.mark.parametrize('content,message', [
    (None, 'no such file'),
    ('', 'is a directory'),
    ('[{"op": "conv",', 'is not JSON'),
    ('[{"op": "conv", "kernel": 3, "rate": [1, 6], "input": 2}]',
     'is not a valid dense prediction cell: operation 0'),
])
def test_flag_errors_name_the_flag_and_the_file(tmp_path, content, message):
  path = tmp_path / 'cell.json'
  if content == '':
    path.mkdir()
    message = 'cannot read %s: .*Is a directory' % re.escape(str(path))
  elif content is not None:
    path.write_text(content)
  flag = '--dense_prediction_cell_json=%s' % path
  with pytest.raises(config.ConfigError) as raised:
    _options_from_flags([flag])
  text = str(raised.value)
  assert text.startswith(flag + ': ') and str(path) in text[len(flag):]
  assert raised.value.fields == ()
  assert re.search(message, text), text


def test_flag_against_saved_options(zoo_cell, tmp_path):
  saved = tt.tiny_model_options().replace(crop_size=None,
                                          dense_prediction_cell_config=zoo_cell)
  # Not given: the saved cell; given with the same cell: fine.
  assert _options_from_flags([], saved).dense_prediction_cell_config == (
      saved.dense_prediction_cell_config)
  assert _options_from_flags(['--depth_multiplier=0.25',
                              '--dense_prediction_cell_json=' + ZOO_CELL_NAME],
                             saved) == saved.replace(crop_size=(65, 65))
  other = tmp_path / 'other.json'
  other.write_text(json.dumps(MIXED_CELL))
  with pytest.raises(config.ConfigError,
                     match=r'--dense_prediction_cell_json=%s \(trained with '
                     'another cell\)' % other):
    _options_from_flags(['--dense_prediction_cell_json=%s' % other], saved)
  with pytest.raises(config.ConfigError,
                     match=r'--dense_prediction_cell_json=%s \(trained with '
                     r'ASPP, no cell\)' % other):
    _options_from_flags(['--dense_prediction_cell_json=%s' % other],
                        saved.replace(dense_prediction_cell_config=None))


# --- training, export, eval, vis ---------------------------------------------


def _tiny_dpc_options(crop):
  return tt.tiny_model_options(crop=crop).replace(
      dense_prediction_cell_config=dpc.load_cell(ZOO_CELL_NAME)).validate()


def test_run_api_trains_and_the_logdir_exports_without_the_flag(
    tmp_path, capsys):
  """Two steps of mobilenet_v2 (depth 0.25) + the zoo's cell at crop 65,
  then deeplab-export of the logdir with no model flag."""
  logdir = str(tmp_path / 'train')
  options = _tiny_dpc_options(65)
  images, labels = tt.synthetic_batch(2, 65)
  train = config.TrainOptions(
      train_batch_size=2, fine_tune_batch_norm=True, base_learning_rate=0.003,
      training_number_of_steps=2).validate()
  runs = config.RunOptions(train_logdir=logdir, save_interval_secs=0,
                           save_summaries_secs=0, log_steps=1).validate()
  result = run_lib.train(
      options, train, runs, ignore_label=255,
      input_fn=tt.constant_input_fn(images, labels),
      preprocess_options=config.PreprocessOptions(crop_size=(65, 65)),
      dataset={'name': 'shapes', 'num_classes': tt.NUM_CLASSES,
               'ignore_label': 255},
      handle_signals=False)
  assert result.status == 'ok' and result.global_step == 2
  assert np.isfinite(result.loss) and result.loss > 0
  trained = tt.read_checkpoint(result.checkpoint)
  assert 'meta_architecture/concat_projection/weights' in trained
  assert not any(name.startswith('aspp') for name in trained)
  saved = config.load_run_config(logdir)[0]
  assert saved.dense_prediction_cell_config == (
      options.dense_prediction_cell_config)

  pb = str(tmp_path / 'frozen.pb')
  code = et.run_cli(export_cli, ['--checkpoint_path=' + logdir,
                                 '--export_path=' + pb, '--crop_size=65,65'])
  assert code == 0, capsys.readouterr().err
  graph_def = freeze.load_frozen_graph(pb)
  assert any(node.name.startswith('meta_architecture/branch4_depthwise/')
             for node in graph_def.node)
  labels = freeze.run_frozen_graph(graph_def,
                                   np.full((50, 61, 3), 120, np.uint8))
  assert labels.shape == (1, 50, 61)
  assert labels.min() >= 0 and labels.max() < tt.NUM_CLASSES


@pytest.mark.slow
def test_cli_trains_with_the_flag_then_eval_and_vis_need_none(
    tmp_path, capsys):
  """deeplab-train --dense_prediction_cell_json (the original's path) at
  output stride 8 (doubled rates); eval and vis read the saved cell; a
  contradicting flag is refused."""
  data = et.write_tiny_dataset(str(tmp_path))
  logdir = str(tmp_path / 'train')
  code = et.run_cli(train_cli, [
      '--train_logdir=' + logdir, '--dataset_dir=' + data, '--dataset=tiny',
      '--train_split=val', '--model_variant=mobilenet_v2',
      '--depth_multiplier=0.25', '--output_stride=8',
      '--decoder_output_stride=4', '--train_crop_size=41,41',
      '--train_batch_size=2', '--training_number_of_steps=1',
      '--dense_prediction_cell_json=' + ORIGINAL_PATH])
  assert code == 0, capsys.readouterr().err
  with open(os.path.join(logdir, config.RUN_CONFIG_FILENAME)) as f:
    saved = json.load(f)['model_options']
  assert len(saved['dense_prediction_cell_config']) == 5
  capsys.readouterr()
  assert et.run_cli(eval_cli, ['--checkpoint_dir=' + logdir,
                               '--dataset_dir=' + data]) == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert result['num_images'] == 4 and 0.0 <= result['miou'] <= 1.0
  out = str(tmp_path / 'vis')
  assert et.run_cli(vis_cli, ['--checkpoint_dir=' + logdir,
                              '--dataset_dir=' + data,
                              '--vis_logdir=' + out]) == 0
  capsys.readouterr()
  other = tmp_path / 'other.json'
  other.write_text(json.dumps(MIXED_CELL[1:2]).replace('"input": 0',
                                                       '"input": -1'))
  assert et.run_cli(eval_cli, ['--checkpoint_dir=' + logdir,
                               '--dataset_dir=' + data,
                               '--dense_prediction_cell_json=%s'
                               % other]) == 2
  assert '--dense_prediction_cell_json=%s (trained with another cell)' % (
      other) in capsys.readouterr().err
