"""deeplab-eval / deeplab-vis --exported_model: what the deployed file does."""
import json
import os
import shutil

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

import eval_testing as et
from deeplab_train import config
from deeplab_train.cli import eval as eval_cli
from deeplab_train.cli import export as export_cli
from deeplab_train.cli import vis as vis_cli
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.evaluation import vis
from deeplab_train.export import freeze
from deeplab_train.export import loaded


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """A tiny split, its checkpoint, and its .pb and SavedModel exports.

  The SavedModel's folder holds a copy of the run config (the .pb's does
  not), so both ways of finding the model options are used.
  """
  root = tmp_path_factory.mktemp('tiny_exported')
  data = et.write_tiny_dataset(str(root))
  train = str(root / 'train')
  checkpoint = et.write_checkpoint(train, et.tiny_model_options())
  pb = str(root / 'bare' / 'frozen.pb')
  saved = str(root / 'deploy' / 'saved_model')
  with et.captured_stdout():
    assert et.run_cli(export_cli, ['--checkpoint_path=' + train,
                                   '--export_path=' + pb,
                                   '--saved_model_dir=' + saved,
                                   '--crop_size=41,41']) == 0
  shutil.copy(os.path.join(train, config.RUN_CONFIG_FILENAME),
              str(root / 'deploy'))
  return {'root': root, 'data': data, 'train': train,
          'checkpoint': checkpoint, 'pb': pb, 'saved_model': saved}


@pytest.fixture(scope='module')
def checkpoint_miou(tiny, tmp_path_factory):
  """deeplab-eval of the checkpoint, padded as the export pads."""
  out = str(tmp_path_factory.mktemp('ckpt_eval'))
  with et.captured_stdout() as stdout:
    assert et.run_cli(eval_cli, [
        '--checkpoint_dir=' + tiny['train'], '--dataset_dir=' + tiny['data'],
        '--eval_logdir=' + out, '--eval_crop_size=41,41']) == 0
  return _last_json_line(stdout.getvalue())['miou']


@pytest.fixture(scope='module')
def checkpoint_labels(tiny):
  """The checkpoint's labels of the tiny images, padded as the export pads."""
  with predictor_lib.Predictor(et.tiny_model_options(),
                               config.InferenceOptions(crop_size=(41, 41))
                               ) as predictor:
    predictor.restore(tiny['checkpoint'])
    return predictor.predict([image.astype(np.float32)
                              for _, image, _ in et.tiny_images()])


def _last_json_line(text):
  return json.loads(text.strip().splitlines()[-1])


def test_eval_of_frozen_graph_equals_checkpoint_eval(tiny, checkpoint_miou,
                                                     capsys):
  """No run config beside the .pb: the flags and dataset.json say."""
  code = et.run_cli(eval_cli, ['--exported_model=' + tiny['pb'],
                               '--dataset_dir=' + tiny['data'],
                               '--eval_batch_size=2'])
  out = capsys.readouterr().out
  assert code == 0
  result = _last_json_line(out)
  assert result['status'] == 'ok' and result['num_images'] == 4
  assert result['exported_model'] == tiny['pb']
  assert result['exported_format'] == 'frozen_graph'
  assert result['checkpoint'] is None and result['global_step'] is None
  assert result['miou'] == pytest.approx(checkpoint_miou, abs=0.001)
  assert 'exported model %s (frozen_graph)' % tiny['pb'] in out
  assert 'mIoU %.4f' % result['miou'] in out
  # Default output folder: eval_NAME beside the file.
  eval_dir = os.path.join(os.path.dirname(tiny['pb']), 'eval_frozen_pb')
  assert {'eval_result.json', 'confusion_matrix.csv',
          'confusion_matrix.png'} <= set(os.listdir(eval_dir))
  with open(os.path.join(eval_dir, 'eval_result.json')) as f:
    assert json.load(f)['miou'] == result['miou']


def test_eval_of_saved_model_equals_checkpoint_eval(tiny, checkpoint_miou,
                                                    tmp_path, capsys):
  """The run config beside the SavedModel names the dataset (tiny)."""
  eval_dir = tmp_path / 'eval'
  code = et.run_cli(eval_cli, ['--exported_model=' + tiny['saved_model'],
                               '--dataset_dir=' + tiny['data'],
                               '--eval_logdir=%s' % eval_dir,
                               '--eval_batch_size=3'])
  result = _last_json_line(capsys.readouterr().out)
  assert code == 0
  assert result['exported_format'] == 'saved_model'
  assert result['dataset'] == 'tiny'
  assert result['miou'] == pytest.approx(checkpoint_miou, abs=0.001)
  events = [f for f in os.listdir(eval_dir) if f.startswith('events.')]
  tags = {v.tag for e in tf.train.summary_iterator(str(eval_dir / events[0]))
          for v in e.summary.value}
  assert 'eval/miou_exported_overall' in tags


def test_loaded_models_agree_with_the_checkpoint(tiny, checkpoint_labels):
  """predict() of one image, a batch of one size and a list of sizes."""
  images = [image for _, image, _ in et.tiny_images()]
  want = checkpoint_labels
  with loaded.open_exported(tiny['saved_model']) as model:
    assert model.kind == 'saved_model' and model.input_size is None
    assert model.num_classes == et.NUM_CLASSES and model.max_batch is None
    for got, labels in zip(model.predict(images), want):
      assert got.dtype == np.int32
      np.testing.assert_array_equal(got, labels)
    batch = np.stack([images[0]] * 3)
    got = model.predict(batch)
    assert got.shape == (3,) + images[0].shape[:2]
    for labels in got:
      np.testing.assert_array_equal(labels, want[0])
  with loaded.open_exported(tiny['pb']) as model:
    assert model.kind == 'frozen_graph' and model.max_batch == 1
    np.testing.assert_array_equal(model.predict(images[1]), want[1])
    # Float images (as the eval pipeline yields them) are rounded to uint8.
    np.testing.assert_array_equal(
        model.predict(images[2].astype(np.float32)), want[2])


def test_vis_from_exported_model_writes_the_pngs(tiny, checkpoint_labels,
                                                 tmp_path, capsys):
  out = str(tmp_path / 'vis')
  code = et.run_cli(vis_cli, ['--exported_model=' + tiny['saved_model'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=' + out,
                              '--also_save_raw_predictions',
                              '--vis_batch_size=2'])
  assert code == 0
  line = _last_json_line(capsys.readouterr().out)
  assert line['num_images'] == 4
  assert line['exported_model'] == tiny['saved_model']
  for (name, image, _), labels in zip(et.tiny_images(), checkpoint_labels):
    raw = et.read_png(os.path.join(out, vis.RAW_FOLDER, name + '.png'))
    np.testing.assert_array_equal(raw, labels)
    colored = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                       name + '_prediction.png'))
    assert colored.shape == image.shape


def _error(capsys):
  captured = capsys.readouterr()
  assert _last_json_line(captured.out)['status'] == 'bad_input'
  return captured.err


def test_missing_and_unknown_files_are_named(tiny, tmp_path, capsys):
  data = '--dataset_dir=' + tiny['data']
  missing = str(tmp_path / 'none.pb')
  assert et.run_cli(eval_cli, ['--exported_model=' + missing, data]) == 2
  assert '--exported_model=%s does not exist' % missing in _error(capsys)

  junk = tmp_path / 'model.pb'
  junk.write_bytes(b'\x00\x01 certainly not a graph')
  assert et.run_cli(eval_cli, ['--exported_model=%s' % junk, data]) == 2
  assert ('--exported_model=%s is not a known exported model' % junk
          in _error(capsys))

  folder = tmp_path / 'empty_folder'
  folder.mkdir()
  assert et.run_cli(vis_cli, ['--exported_model=%s' % folder, data,
                              '--vis_logdir=%s' % (tmp_path / 'v')]) == 2
  assert ('--exported_model=%s is a folder but not a SavedModel' % folder
          in _error(capsys))

  fake_tflite = tmp_path / 'model.tflite'
  fake_tflite.write_bytes(b'0123456789')
  assert et.run_cli(eval_cli, ['--exported_model=%s' % fake_tflite,
                               data]) == 2
  assert 'is named like a TFLite model but is not one' in _error(capsys)


def test_saved_model_without_the_signature_is_named(tiny, tmp_path, capsys):
  path = str(tmp_path / 'other_model')
  with tf.Graph().as_default() as graph:
    x = tf.placeholder(tf.float32, [None, 4], name='x')
    y = tf.identity(x * 2.0, name='y')
    with tf.Session(graph=graph) as sess:
      builder = tf.saved_model.Builder(path)
      builder.add_meta_graph_and_variables(
          sess, [tf.saved_model.tag_constants.SERVING],
          signature_def_map={'double': (
              tf.saved_model.signature_def_utils.predict_signature_def(
                  {'x': x}, {'y': y}))})
      builder.save()
  assert et.run_cli(eval_cli, ['--exported_model=' + path,
                               '--dataset_dir=' + tiny['data']]) == 2
  err = _error(capsys)
  assert ("the SavedModel --exported_model=%s has no 'serving_default' "
          'signature (signatures: double)' % path) in err


def test_image_larger_than_the_export_crop_is_named(tiny):
  """A ConfigError (exit 2 in the commands) naming image, file and crop."""
  big = np.zeros((50, 30, 3), np.uint8)
  for path in (tiny['pb'], tiny['saved_model']):
    with loaded.open_exported(path) as model:
      with pytest.raises(config.ImageTooLargeError) as caught:
        model.predict([big], names=['big_one'])
    message = caught.value.render(lambda field: '--exported_model')
    assert 'image big_one is 50x30 (height x width), too large' in message
    # The path alone: deeplab-vis logs this as it skips the image, in no
    # command's terms (it read 'path=').
    assert 'too large for the exported model %s: ' % path in message
    # The assertion's own words, without TensorFlow's '[Condition x <= y
    # did not hold element-wise:] [x (strided_slice_3:0) = ] ...'.
    assert message.endswith('input image (after any resize) is larger than '
                            'the export crop size 41,41; re-export with a '
                            'larger crop_size or with max_resize_value')


def test_an_original_graph_too_small_for_an_image_is_named(tmp_path):
  """The original's frozen graph does not check the image against its crop:
  it pads a larger image to the image's size, cuts the labels to the crop
  and stretches them back (exit 0, wrong labels), or fails in its decoder
  (deeplab-vis stopped: 'failed on image b_big.jpg: Node: 'concat''). Such
  an image is now refused as too large before the graph runs, as our
  graphs refuse it, so deeplab-vis skips it; unless the graph resizes the
  images first."""
  def original_graph(path, resizes):
    with tf.Graph().as_default() as graph:
      image = tf.placeholder(tf.uint8, [1, None, None, 3],
                             name=freeze.INPUT_NAME)
      size = tf.shape(image)[1:3]
      if resizes:
        with tf.name_scope('resize_to_range'):
          tf.identity(size)
      padded = tf.pad(tf.cast(image, tf.float32), [
          [0, 0], [0, tf.maximum(9 - size[0], 0)],
          [0, tf.maximum(9 - size[1], 0)], [0, 0]])
      labels = tf.cast(tf.reduce_sum(padded, -1) > 0, tf.int32)
      raw = tf.slice(labels, [0, 0, 0], [1, 9, 9],
                     name=freeze.RAW_OUTPUT_NAME)
      cut = raw[:, :size[0], :size[1], None]
      tf.identity(tf.image.resize(cut, size, 'nearest')[..., 0],
                  name=freeze.OUTPUT_NAME)
      path.write_bytes(graph.as_graph_def().SerializeToString())
    return str(path)

  pb = original_graph(tmp_path / 'original.pb', resizes=False)
  with loaded.open_exported(pb) as model:
    labels = model.predict([np.ones((5, 7, 3), np.uint8)])
    assert labels[0].shape == (5, 7) and labels[0].all()
    with pytest.raises(config.ImageTooLargeError) as caught:
      model.predict([np.ones((12, 7, 3), np.uint8)], names=['b_big'])
  assert caught.value.render() == (
      'image b_big is 12x7 (height x width), too large for the exported '
      'model %s: larger than the export crop size 9,9 (its '
      'RawSemanticPredictions:0), which that graph does not check: it would '
      'cut the labels to the crop; re-export with a larger crop_size or with '
      'max_resize_value' % pb)
  # A graph that resizes the images first takes them as they are.
  pb = original_graph(tmp_path / 'resizing.pb', resizes=True)
  with loaded.open_exported(pb) as model:
    assert model.predict([np.ones((12, 7, 3), np.uint8)])[0].shape == (12, 7)


def test_a_failure_is_named_by_its_reason_not_its_node():
  message = ('Graph execution error:\n\nDetected at node \'concat\' defined '
             'at (most recent call last):\n  File "export_model.py", line 9, '
             'in <module>\nNode: \'concat\'\nConcatOp : Dimension 1 in both shapes must be '
             'equal: shape[0] = [1,9,9] vs. shape[1] = [1,15,9]\n\t '
             '[[{{node concat}}]]')
  assert loaded._first_meaningful_line(message) == (
      'ConcatOp : Dimension 1 in both shapes must be equal: shape[0] = '
      '[1,9,9] vs. shape[1] = [1,15,9]')


def test_flags_an_exported_model_cannot_honour(tiny, tmp_path, capsys):
  data = '--dataset_dir=' + tiny['data']
  assert et.run_cli(eval_cli, ['--exported_model=' + tiny['pb'], data,
                               '--eval_crop_size=65,65',
                               '--add_flipped_images']) == 2
  assert ('--eval_crop_size, --add_flipped_images cannot apply to '
          '--exported_model' in _error(capsys))
  assert et.run_cli(eval_cli, ['--exported_model=' + tiny['pb'], data,
                               '--checkpoint_dir=' + tiny['train']]) == 2
  assert 'give --checkpoint_dir or --exported_model, not both' in (
      _error(capsys))
  assert et.run_cli(eval_cli, ['--exported_model=' + tiny['pb'], data,
                               '--eval_interval_secs=1']) == 2
  assert '--exported_model is evaluated once' in _error(capsys)
  # deeplab-bench takes several (the flag is shared); eval and vis one.
  twice = ['--exported_model=' + tiny['pb']] * 2 + [data]
  for cli, extra in ((eval_cli, []),
                     (vis_cli, ['--vis_logdir=%s' % (tmp_path / 'vis')])):
    assert et.run_cli(cli, twice + extra) == 2
    assert ('--exported_model given 2 times: this command takes one '
            'exported model' in _error(capsys))


@pytest.mark.slow
def test_eval_of_tflite_model(tiny, checkpoint_miou, checkpoint_labels,
                              tmp_path, capsys):
  """Float TFLite: the mean-pixel padding is rounded to uint8 (128 for
  127.5), so labels near the padding may differ slightly."""
  from deeplab_train.export import tflite  # pylint: disable=g-import-not-at-top
  model, _ = tflite.convert(
      tiny['checkpoint'], et.tiny_model_options(),
      config.ExportOptions(
          inference=config.InferenceOptions(crop_size=(41, 41)),
          with_probabilities=False), tflite.TfliteOptions())
  path = tflite.write_tflite(model, str(tmp_path / 'model.tflite'))
  images = [image for _, image, _ in et.tiny_images()]
  want = checkpoint_labels
  with loaded.open_exported(path) as exported:
    assert exported.kind == 'tflite' and exported.input_size == (41, 41)
    got = exported.predict(images)
  agree = np.mean(np.concatenate([(g == w).ravel()
                                  for g, w in zip(got, want)]))
  assert agree >= 0.97
  code = et.run_cli(eval_cli, ['--exported_model=' + path,
                               '--dataset_dir=' + tiny['data'],
                               '--eval_logdir=%s' % (tmp_path / 'eval')])
  result = _last_json_line(capsys.readouterr().out)
  assert code == 0 and result['exported_format'] == 'tflite'
  assert result['eval_crop_size'] == [41, 41]
  assert result['miou'] == pytest.approx(checkpoint_miou, abs=0.02)
  # An image larger than the fixed input is named, with the file (without
  # an option: deeplab-vis logs it as 'path=' as it skipped the image).
  big = et.tiny_images(seed=3, sizes=((57, 49),))[0][1]
  with loaded.open_exported(path) as exported:
    with pytest.raises(config.ImageTooLargeError,
                       match='image big is 57x49 .* larger than the input '
                             '41x41 of the TFLite model %s: re-export' % path):
      exported.predict(big, names='big')
  # With the training resize, it is shrunk to fit and labelled at its size,
  # as by a frozen graph exported with that resize.
  frozen, _, _ = freeze.freeze(
      tiny['checkpoint'], et.tiny_model_options(),
      config.ExportOptions(
          inference=config.InferenceOptions(crop_size=(41, 41)),
          max_resize_value=41, with_probabilities=False))
  resize = config.PreprocessOptions(crop_size=None, max_resize_value=41)
  with loaded.open_exported(path, resize_options=resize) as exported:
    got = exported.predict(big)
  assert got.shape == (57, 49)
  assert np.mean(got == freeze.run_frozen_graph(frozen, big)[0]) >= 0.95


def test_a_tflite_model_resizes_its_input_as_recorded_at_export(tiny,
                                                                 tmp_path):
  """A .tflite exported with --max_resize_value was evaluated without the
  resize unless the flags were given again: deeplab-eval scored another
  model, exit 0 (the frozen graph resizes inside)."""
  from deeplab_train.export import tflite  # pylint: disable=g-import-not-at-top
  options = config.ExportOptions(
      inference=config.InferenceOptions(crop_size=(41, 41)),
      max_resize_value=41, resize_factor=8, with_probabilities=False)
  model, _ = tflite.convert(tiny['checkpoint'], et.tiny_model_options(),
                            options, tflite.TfliteOptions())
  path = tflite.write_tflite(model, str(tmp_path / 'model.tflite'))
  frozen, _, _ = freeze.freeze(tiny['checkpoint'], et.tiny_model_options(),
                               options)
  big = et.tiny_images(seed=3, sizes=((57, 49),))[0][1]
  with loaded.open_exported(path) as exported:
    got = exported.predict(big)
  assert got.shape == (57, 49)
  assert np.mean(got == freeze.run_frozen_graph(frozen, big)[0]) >= 0.95
  # The same values given agree, also some of them (no resize factor
  # given); others are refused, naming both.
  for same in (config.PreprocessOptions(crop_size=None, max_resize_value=41),
               config.PreprocessOptions(crop_size=None)):
    with loaded.open_exported(path, resize_options=same) as exported:
      np.testing.assert_array_equal(exported.predict(big), got)
  other = config.PreprocessOptions(crop_size=None, min_resize_value=30,
                                   max_resize_value=41)
  with pytest.raises(loaded.ExportedModelError,
                     match='was exported with the resize min_resize_value='
                     'None, max_resize_value=41, resize_factor=8, and the '
                     'resize given contradicts it \\(min_resize_value=30, '
                     'max_resize_value=41\\)'):
    loaded.open_exported(path, resize_options=other,
                         resize_given=('min_resize_value', 'max_resize_value'))
  # The training run's resize (its deeplab_config.json beside the model),
  # which the export overrode, gives way: such a model could not be
  # scored or drawn.
  with loaded.open_exported(path, resize_options=other) as exported:
    np.testing.assert_array_equal(exported.predict(big), got)


def test_default_output_folders_of_two_exports_of_one_name_differ():
  """OUT/model.pb and OUT/model.tflite (a float export and its quantised
  one, compared before shipping) both evaluated into OUT/eval_model: the
  second run replaced the first's results."""
  assert loaded.output_folder_beside('/o/model.pb', 'eval') == (
      '/o/eval_model_pb')
  assert loaded.output_folder_beside('/o/model.tflite', 'eval') == (
      '/o/eval_model_tflite')
  assert loaded.output_folder_beside('/o/saved_model/', 'eval') == (
      '/o/eval_saved_model')


def test_an_export_without_its_dataset_names_what_to_give(tiny, tmp_path,
                                                           capsys):
  """deeplab-vis of a bare .pb without --dataset_dir said only 'evaluate it
  on the dataset it was trained on', naming no flag."""
  photos = tmp_path / 'photos'
  photos.mkdir()
  Image.fromarray(et.tiny_images()[0][1]).save(photos / 'a.png')
  # With a colormap of 19 colours, the default dataset's 21 classes were
  # taken for the model's ('the model predicts 21: choose pascal').
  for extra in ([], ['--colormap_type=cityscapes']):
    assert et.run_cli(vis_cli, ['--exported_model=' + tiny['pb'],
                                '--image_dir=%s' % photos,
                                '--vis_logdir=%s' % (tmp_path / 'out')]
                      + extra) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert ('give the dataset it was trained on (--dataset_dir='
            'ITS_TFRECORDS, or --dataset=ITS_NAME), or put the '
            'deeplab_config.json of its training run beside it') in err, err
