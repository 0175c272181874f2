"""deeplab-export --tflite_path: conversion, quantization, the runner."""
# pylint: disable=protected-access
import json
import os

from absl import flags
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import eval_testing as et
from deeplab_train import config
from deeplab_train.cli import export as export_cli
from deeplab_train.data import datasets
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.export import tflite

CROP = (41, 41)
# tf.lite.Interpreter (used when LiteRT is not installed) warns that it is
# deprecated.
pytestmark = pytest.mark.filterwarnings(
    'ignore:.*tf.lite.Interpreter is deprecated')


@pytest.fixture(scope='module')
def tiny_ckpt(tmp_path_factory):
  logdir = str(tmp_path_factory.mktemp('tiny_tflite') / 'train')
  return et.write_checkpoint(logdir, et.tiny_model_options())


@pytest.fixture(scope='module')
def dataset_dir(tmp_path_factory):
  """The tiny images as TFRecords of split 'train' (calibration data)."""
  return et.write_tiny_dataset(str(tmp_path_factory.mktemp('tiny_data')),
                               split='train')


@pytest.fixture(scope='module')
def padded_images():
  """The tiny images padded to the crop as the TFLite model expects them:
  uint8, with the mean pixel rounded (128)."""
  value = tflite.padding_value((127.5, 127.5, 127.5))
  out = np.empty((len(et.SIZES),) + CROP + (3,), np.uint8)
  out[...] = value
  for i, (_, image, _) in enumerate(et.tiny_images()):
    out[i, :image.shape[0], :image.shape[1]] = image
  return out


@pytest.fixture(scope='module')
def in_graph(tiny_ckpt, padded_images):
  """Predictor labels of exactly the images the TFLite model gets."""
  return np.stack(_predictor_labels(
      tiny_ckpt, config.InferenceOptions(crop_size=CROP), padded_images))


@pytest.fixture(scope='module')
def models(tiny_ckpt, dataset_dir, tmp_path_factory):
  """{quantize mode: (path, the command's JSON line)}, one export each."""
  out = tmp_path_factory.mktemp('tflite_models')
  models = {}
  for mode in tflite.QUANTIZE_MODES:
    path = str(out / ('%s.tflite' % mode))
    line = _export(['--checkpoint_path=' + tiny_ckpt, '--tflite_path=' + path,
                    '--crop_size=41,41', '--tflite_quantize=' + mode,
                    '--dataset_dir=' + dataset_dir,
                    '--num_calibration_images=3'])
    models[mode] = (path, line)
  return models


def _predictor_labels(checkpoint, inference, images):
  with predictor_lib.Predictor(et.tiny_model_options(), inference) as pred:
    pred.restore(checkpoint)
    return pred.predict([im.astype(np.float32) for im in images])


def _export(args):
  """Runs deeplab-export; returns its JSON line (asserting exit 0)."""
  with et.captured_stdout() as stdout:
    code = et.run_cli(export_cli, args)
  assert code == 0, stdout.getvalue()
  return json.loads(stdout.getvalue().strip().splitlines()[-1])


def _export_fails(args, capsys):
  """Runs deeplab-export expecting exit 2; returns its stderr."""
  capsys.readouterr()
  assert et.run_cli(export_cli, args) == 2
  return capsys.readouterr().err


def _ops(path):
  """{(op name, first operand type name)} of a .tflite file, read without
  delegates (which would hide the ops)."""
  interpreter = tf.lite.Interpreter(
      model_path=path, experimental_op_resolver_type=(
          tf.lite.experimental.OpResolverType
          .BUILTIN_WITHOUT_DEFAULT_DELEGATES))
  interpreter.allocate_tensors()
  return {(op['op_name'], op['operand_types'][0].__name__)
          for op in interpreter._get_ops_details()}


def test_float_model_alone_matches_in_graph_inference(models, in_graph,
                                                      padded_images):
  path, line = models['none']
  # --tflite_path alone: no frozen graph, no SavedModel, no temp files.
  assert line['status'] == 'ok' and line['tflite_path'] == path
  assert line['export_path'] is None and line['saved_model_dir'] is None
  assert line['tflite_quantize'] == 'none' and 'calibration_images' not in line
  assert line['tflite_bytes'] == os.path.getsize(path)
  assert sorted(os.listdir(os.path.dirname(path))) == sorted(
      '%s.tflite' % m for m in tflite.QUANTIZE_MODES)

  runner = tflite.TfliteRunner(path, num_threads=1)
  assert runner.input_size == CROP
  assert runner.num_classes == et.NUM_CLASSES
  assert runner.mean_pixel == (127.5, 127.5, 127.5)
  labels = runner.predict(padded_images)
  assert labels.shape == (len(padded_images),) + CROP
  assert labels.dtype == np.int32
  assert np.mean(labels == in_graph) >= 0.999
  assert len(np.unique(labels)) == et.NUM_CLASSES
  ops = {name for name, _ in _ops(path)}
  # The argmax is inside and gives int32 itself.
  assert 'ARG_MAX' in ops and ('CAST', 'int64') not in _ops(path)


def test_float_model_on_the_original_padding(tiny_ckpt, models):
  """Against the frozen graph's exact mean padding (127.5, which uint8
  cannot hold): the labels of the image's own pixels nearly all agree."""
  images = [image for _, image, _ in et.tiny_images()]
  want = _predictor_labels(tiny_ckpt, config.InferenceOptions(crop_size=CROP),
                           images)
  runner = tflite.TfliteRunner(models['none'][0])
  agree, total = 0, 0
  for image, labels in zip(images, want):
    padded = np.full((1,) + CROP + (3,), 128, np.uint8)
    padded[0, :image.shape[0], :image.shape[1]] = image
    got = runner.predict(padded)[0, :image.shape[0], :image.shape[1]]
    agree += np.sum(got == labels)
    total += labels.size
  print('agreement with the 127.5-padded in-graph labels: %.5f'
        % (agree / total))
  assert agree / total >= 0.99


def test_probabilities_output(models, padded_images):
  interpreter = tf.lite.Interpreter(model_path=models['none'][0])
  interpreter.allocate_tensors()
  inputs = interpreter.get_input_details()
  assert [(d['name'], d['dtype'], tuple(d['shape'])) for d in inputs] == [
      ('ImageTensor', np.uint8, (1,) + CROP + (3,))]
  outputs = {d['name']: d for d in interpreter.get_output_details()}
  assert sorted(outputs) == ['SemanticPredictions', 'SemanticProbabilities']
  interpreter.set_tensor(inputs[0]['index'], padded_images[:1])
  interpreter.invoke()
  probs = interpreter.get_tensor(outputs['SemanticProbabilities']['index'])
  labels = interpreter.get_tensor(outputs['SemanticPredictions']['index'])
  assert probs.shape == (1,) + CROP + (et.NUM_CLASSES,)
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-4)
  assert np.mean(np.argmax(probs, -1) == labels) >= 0.999


def test_quantized_models_agree_with_float(models, padded_images):
  float_labels = tflite.TfliteRunner(models['none'][0]).predict(padded_images)
  sizes = {}
  agreement = {}
  for mode in tflite.QUANTIZE_MODES:
    path, line = models[mode]
    runner = tflite.TfliteRunner(path)
    assert runner.input_size == CROP and runner.num_classes == et.NUM_CLASSES
    assert runner.metadata['quantize'] == mode
    labels = runner.predict(padded_images)
    assert labels.dtype == np.int32
    sizes[mode] = os.path.getsize(path)
    agreement[mode] = float(np.mean(labels == float_labels))
  print('tflite sizes (bytes): %s' % sizes)
  print('pixel agreement with float: %s' % agreement)
  assert agreement['float16'] >= 0.995
  assert agreement['dynamic'] >= 0.98
  # A tiny random network: int8 still agrees on most pixels.
  assert agreement['int8'] >= 0.8
  assert sizes['float16'] < 0.7 * sizes['none']
  assert sizes['dynamic'] < 0.7 * sizes['none']


def test_int8_is_integer_inside_with_uint8_in_int32_out(models):
  path, line = models['int8']
  # The split has 4 images; 3 were asked for.
  assert line['calibration_images'] == 3
  runner = tflite.TfliteRunner(path)
  assert runner._input['dtype'] == np.uint8
  assert runner._labels['dtype'] == np.int32
  ops = _ops(path)
  assert {('CONV_2D', 'int8'), ('DEPTHWISE_CONV_2D', 'int8'),
          ('ARG_MAX', 'int8')} <= ops
  assert ('CONV_2D', 'float32') not in ops


def test_calibration_reads_the_split(dataset_dir):
  """Every image of the split, padded with the rounded mean pixel."""
  info = datasets.load_dataset_info('tiny', dataset_dir)
  images = list(tflite.calibration_images(
      dataset_dir, 'train', info, config.PreprocessOptions(crop_size=None),
      (127.5, 127.5, 127.5), CROP, count=100))
  assert len(images) == len(et.SIZES)
  for _, original, _ in et.tiny_images():
    h, w = original.shape[:2]
    matches = [im for im in images
               if np.array_equal(im[0, :h, :w], original)]
    assert len(matches) == 1
    assert matches[0].shape == (1,) + CROP + (3,)
    assert matches[0].dtype == np.uint8
    assert (matches[0][0, h:] == 128).all()
    assert (matches[0][0, :, w:] == 128).all()
  assert len(list(tflite.calibration_images(
      dataset_dir, 'train', info, config.PreprocessOptions(crop_size=None),
      (127.5, 127.5, 127.5), CROP, count=2))) == 2


def test_int8_calibration_errors_name_the_flag(tiny_ckpt, dataset_dir,
                                               tmp_path, capsys):
  path = str(tmp_path / 'q.tflite')
  args = ['--checkpoint_path=' + tiny_ckpt, '--tflite_path=' + path,
          '--crop_size=41,41', '--tflite_quantize=int8']
  err = _export_fails(args, capsys)
  assert '--tflite_quantize=int8' in err and '--dataset_dir' in err
  err = _export_fails(args + ['--dataset_dir=' + dataset_dir,
                              '--calibration_split=val'], capsys)
  assert '--calibration_split=val' in err and "split 'val'" in err
  err = _export_fails(args + ['--dataset_dir=%s/none' % tmp_path], capsys)
  assert '--dataset_dir' in err and 'not a folder' in err
  err = _export_fails(args + ['--dataset_dir=' + dataset_dir,
                              '--num_calibration_images=0'], capsys)
  assert '--num_calibration_images must be >= 1' in err
  err = _export_fails(['--checkpoint_path=' + tiny_ckpt,
                       '--export_path=%s/x.pb' % tmp_path,
                       '--tflite_quantize=dynamic'], capsys)
  assert '--tflite_quantize only applies' in err
  assert os.listdir(tmp_path) == []


def test_int8_export_warns_of_keep_aspect_ratio_once(tiny_ckpt, dataset_dir,
                                                     tmp_path, caplog):
  """The calibration resizes as the exported graph does, from the same
  flags, read once: one warning for --keep_aspect_ratio=false, not two."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['deeplab-export', '--checkpoint_path=' + tiny_ckpt,
                 '--tflite_path=%s/q.tflite' % tmp_path, '--crop_size=41,41',
                 '--tflite_quantize=int8', '--dataset_dir=' + dataset_dir,
                 '--keep_aspect_ratio=false'])
    with caplog.at_level('WARNING'):
      job = export_cli.options_from_flags()
  finally:
    flags.FLAGS.unparse_flags()
  assert caplog.text.count('--keep_aspect_ratio=false has no effect') == 1
  assert job.preprocess_options == config.PreprocessOptions(crop_size=None)
  assert job.export_options.min_resize_value is None


def test_unconvertible_network_names_op_and_flag(tmp_path, capsys, caplog):
  """Argmax-then-resize labels: TFLite has no int64 nearest resize. The
  flag the message names now exports it (before: refused for contradicting
  the checkpoint's saved options, though it changes no variable)."""
  options = et.tiny_model_options(prediction_with_upsampled_logits=False)
  ckpt = et.write_checkpoint(str(tmp_path / 'train'), options)
  out = tmp_path / 'out'
  err = _export_fails(['--checkpoint_path=' + ckpt,
                       '--export_path=%s/frozen.pb' % out,
                       '--tflite_path=%s/model.tflite' % out,
                       '--crop_size=41,41'], capsys)
  assert 'ResizeNearestNeighbor' in err
  assert '--prediction_with_upsampled_logits=true' in err
  assert 'Traceback' not in err
  # Converted before anything is written: no half of the exports.
  assert not out.exists() or os.listdir(out) == []
  # The frozen graph alone still exports.
  assert _export(['--checkpoint_path=' + ckpt,
                  '--export_path=%s/frozen.pb' % out,
                  '--crop_size=41,41'])['status'] == 'ok'
  with caplog.at_level('WARNING'):
    assert _export(['--checkpoint_path=' + ckpt,
                    '--tflite_path=%s/model.tflite' % out,
                    '--prediction_with_upsampled_logits=true',
                    '--crop_size=41,41'])['status'] == 'ok'
  assert ('predicting with --prediction_with_upsampled_logits=True (trained '
          'with False)') in caplog.text
  assert (out / 'model.tflite').stat().st_size > 0


def test_runner_checks_its_input(models, padded_images):
  runner = tflite.TfliteRunner(models['none'][0])
  with pytest.raises(ValueError, match=r'images \[N, 41, 41, 3\]'):
    runner.predict(np.zeros((1, 33, 41, 3), np.uint8))
  with pytest.raises(ValueError, match='uint8'):
    runner.predict(padded_images.astype(np.float32))
  assert runner.predict(padded_images[:0]).shape == (0,) + CROP


@pytest.mark.slow
def test_multi_scale_flipped_model_matches_in_graph(tiny_ckpt, padded_images,
                                                    tmp_path):
  path = str(tmp_path / 'ms.tflite')
  _export(['--checkpoint_path=' + tiny_ckpt, '--tflite_path=' + path,
           '--crop_size=41,41', '--inference_scales=0.5',
           '--inference_scales=1.0', '--add_flipped_images',
           '--noexport_probabilities'])
  runner = tflite.TfliteRunner(path)
  outputs = runner._interpreter.get_output_details()
  assert [d['name'] for d in outputs] == ['SemanticPredictions']
  want = _predictor_labels(
      tiny_ckpt, config.InferenceOptions(crop_size=CROP, scales=(0.5, 1.0),
                                         add_flipped_images=True),
      padded_images[:2])
  assert np.mean(runner.predict(padded_images[:2]) == want) >= 0.999
