"""Same weights, same image -> same output as the original's exported graph.

For each reference (tests/reference/NAME/ with the manifest of the same
name), the reference checkpoint is written with the reference value rule
(reference_checkpoint.py: deterministic values for every variable of the
manifest, with the weight gain its info.json gives, as the original was
given them); our graph restores it by variable name and runs input.png the
way the original's export does: no resize (the image fits the export crop),
pad bottom/right to the crop with the mean pixel, normalise in the model,
upsample the logits bilinearly (align_corners) to the crop, argmax, crop
back to the image size.
"""
import json

import numpy as np
import pytest
from PIL import Image

import model_testing as mt
import reference_checkpoint
from deeplab_train.model import deeplab
from deeplab_train.model import registry

tf = mt.tf

# References with a numeric check (a folder under tests/reference/).
REFERENCES = (
    'mobilenet_v2_os8',
    'mobilenet_v3_large_seg',
    'mobilenet_edgetpu',
    'resnet_v1_18_beta',
    'nas_pnasnet',
)
MIN_PIXEL_AGREEMENT = 0.99
LOGITS_ATOL = 1e-3


@pytest.fixture(scope='module', params=REFERENCES)
def name(request):
  return request.param


def _info(reference_dir, name):
  with open(reference_dir / name / 'info.json') as f:
    return json.load(f)


@pytest.fixture(scope='module')
def checkpoint(reference_dir, name, tmp_path_factory):
  """A checkpoint prefix with the reference values."""
  info = _info(reference_dir, name)
  prefix = tmp_path_factory.mktemp('reference_ckpt') / 'model.ckpt'
  return reference_checkpoint.write_checkpoint(
      mt.load_manifest(reference_dir, name), prefix,
      weight_gain=info.get('weight_gain', reference_checkpoint.WEIGHT_GAIN),
      bias_scale=info.get('bias_scale', reference_checkpoint.BIAS_SCALE))


def _export_like_outputs(image, options):
  """(logits, predictions) tensors for one uint8 image, as the export runs.

  Args:
    image: uint8 placeholder [1, H, W, 3] with H, W <= the crop size.
    options: ModelOptions with crop_size = the export crop.

  Returns:
    (merged logits [1, h, w, C], int predictions [1, H, W]).
  """
  height, width = tf.shape(image)[1], tf.shape(image)[2]
  crop_height, crop_width = options.crop_size
  mean = np.array(registry.mean_pixel(options.model_variant), np.float32)
  # Pad bottom/right with the mean pixel (0 after normalisation).
  padded = tf.image.pad_to_bounding_box(
      tf.cast(image, tf.float32) - mean, 0, 0, crop_height, crop_width) + mean
  padded.set_shape([1, crop_height, crop_width, 3])
  logits = deeplab.multi_scale_logits(padded, options)
  with tf.variable_scope(tf.get_variable_scope(), reuse=True):
    labels = deeplab.predict_labels(padded, options)[deeplab.OUTPUT_TYPE]
  return (logits[deeplab.OUTPUT_TYPE][deeplab.MERGED_LOGITS_SCOPE],
          labels[:, :height, :width])


@pytest.fixture(scope='module')
def ours(reference_dir, name, checkpoint):
  """Our logits and predictions on input.png with the reference weights."""
  manifest = mt.load_manifest(reference_dir, name)
  # The export crop: the size of the raw predictions before the crop back.
  export_crop = tuple(_info(reference_dir, name)['raw_predictions_shape'][1:])
  options = mt.options_from_manifest_config(manifest['config']).replace(
      crop_size=export_crop)
  image = np.array(Image.open(reference_dir / 'input.png').convert('RGB'))
  graph = tf.Graph()
  with graph.as_default():
    placeholder = tf.placeholder(tf.uint8, [1, None, None, 3])
    logits, predictions = _export_like_outputs(placeholder, options)
    saver = tf.train.Saver()
    with tf.Session() as sess:
      saver.restore(sess, checkpoint)
      return sess.run([logits, predictions], {placeholder: image[None]})


def test_checkpoint_covers_exactly_our_variables(reference_dir, name,
                                                 checkpoint):
  manifest = mt.load_manifest(reference_dir, name)
  options = mt.options_from_manifest_config(manifest['config'])
  graph = tf.Graph()
  with graph.as_default():
    mt.build_logits(options, batch_size=1, is_training=False,
                    fine_tune_batch_norm=False)
  in_checkpoint = {(name, tuple(shape)) for name, shape
                   in tf.train.list_variables(checkpoint)
                   if name != 'global_step'}
  assert mt.variable_shapes(graph) == in_checkpoint


def test_logits_match_reference(reference_dir, name, ours):
  logits, _ = ours
  expected = np.load(reference_dir / name / 'logits.npy')
  assert logits.shape == expected.shape
  max_diff = float(np.abs(logits - expected).max())
  print('max |logit - reference| = %.3g' % max_diff)
  assert max_diff <= LOGITS_ATOL


def test_predictions_match_reference(reference_dir, name, ours):
  _, predictions = ours
  expected = np.load(reference_dir / name / 'predictions.npy')
  assert predictions.shape == expected.shape
  agreement = float((predictions == expected).mean())
  print('prediction agreement = %.4f %%' % (100 * agreement))
  assert agreement >= MIN_PIXEL_AGREEMENT
  # The reference image is not a degenerate one-class prediction.
  assert len(np.unique(expected)) > 1
