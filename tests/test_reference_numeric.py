"""Same weights, same image -> same output as the original's exported graph.

The reference checkpoint is written with the reference value rule
(reference_checkpoint.py: deterministic values for every variable of
mobilenet_v2_os8.json, as the original was given them); our
graph restores it by variable name and runs input.png the way the
original's export does: no resize (the image fits the 513 crop), pad
bottom/right to 513x513 with the mean pixel 127.5, normalise in the model,
upsample the 65x65 logits bilinearly (align_corners) to 513x513, argmax,
crop back to the image size.
"""
import numpy as np
import pytest
from PIL import Image

import model_testing as mt
import reference_checkpoint
from deeplab_train.model import deeplab
from deeplab_train.model import registry

tf = mt.tf

MANIFEST = 'mobilenet_v2_os8'
EXPORT_CROP = (513, 513)
MIN_PIXEL_AGREEMENT = 0.99
LOGITS_ATOL = 1e-3


@pytest.fixture(scope='module')
def checkpoint(reference_dir, tmp_path_factory):
  """A checkpoint prefix with the reference values."""
  prefix = tmp_path_factory.mktemp('reference_ckpt') / 'model.ckpt'
  return reference_checkpoint.write_checkpoint(
      mt.load_manifest(reference_dir, MANIFEST), prefix)


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
def ours(reference_dir, checkpoint):
  """Our logits and predictions on input.png with the reference weights."""
  manifest = mt.load_manifest(reference_dir, MANIFEST)
  options = mt.options_from_manifest_config(manifest['config']).replace(
      crop_size=EXPORT_CROP)
  image = np.array(Image.open(reference_dir / 'input.png').convert('RGB'))
  graph = tf.Graph()
  with graph.as_default():
    placeholder = tf.placeholder(tf.uint8, [1, None, None, 3])
    logits, predictions = _export_like_outputs(placeholder, options)
    saver = tf.train.Saver()
    with tf.Session() as sess:
      saver.restore(sess, checkpoint)
      return sess.run([logits, predictions], {placeholder: image[None]})


def test_checkpoint_covers_exactly_our_variables(reference_dir, checkpoint):
  manifest = mt.load_manifest(reference_dir, MANIFEST)
  options = mt.options_from_manifest_config(manifest['config'])
  graph = tf.Graph()
  with graph.as_default():
    mt.build_logits(options, batch_size=1, is_training=False,
                    fine_tune_batch_norm=False)
  in_checkpoint = {(name, tuple(shape)) for name, shape
                   in tf.train.list_variables(checkpoint)
                   if name != 'global_step'}
  assert mt.variable_shapes(graph) == in_checkpoint


def test_logits_match_reference(reference_dir, ours):
  logits, _ = ours
  expected = np.load(reference_dir / MANIFEST / 'logits.npy')
  assert logits.shape == expected.shape
  max_diff = float(np.abs(logits - expected).max())
  print('max |logit - reference| = %.3g' % max_diff)
  assert max_diff <= LOGITS_ATOL


def test_predictions_match_reference(reference_dir, ours):
  _, predictions = ours
  expected = np.load(reference_dir / MANIFEST / 'predictions.npy')
  assert predictions.shape == expected.shape
  agreement = float((predictions == expected).mean())
  print('prediction agreement = %.4f %%' % (100 * agreement))
  assert agreement >= MIN_PIXEL_AGREEMENT
  # The reference image is not a degenerate one-class prediction.
  assert len(np.unique(expected)) > 1
