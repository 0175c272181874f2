"""Helpers shared by the eval / vis / export tests.

A tiny dataset (PNG images + labels converted to TFRecords by the data
package's converter) and a tiny checkpoint written straight from the model
graph with deterministic weights (no trainer needed), with the run config
saved beside it as deeplab-train does.
"""
import contextlib
import io
import math
import os
import zlib

import numpy as np
from absl import flags
from PIL import Image
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.data import build
from deeplab_train.model import deeplab

NUM_CLASSES = 3
IGNORE = 255
# Image sizes (H, W): all fit in a 41x41 crop (output stride 8 -> 5*8+1).
SIZES = ((33, 41), (40, 27), (25, 38), (41, 41))
CROP = (41, 41)


def tiny_model_options(**changes):
  values = dict(num_classes=NUM_CLASSES, model_variant='mobilenet_v2',
                output_stride=8, depth_multiplier=0.25, aspp_convs_filters=16)
  values.update(changes)
  return config.ModelOptions(**values)


def tiny_images(seed=0, sizes=SIZES):
  """[(name, uint8 image, uint8 label)] with some ignore pixels."""
  rng = np.random.RandomState(seed)
  out = []
  for i, (h, w) in enumerate(sizes):
    yy, xx = np.mgrid[:h, :w]
    # Smooth colour ramps plus noise: the network sees structure.
    image = np.stack([(yy * 255 // h), (xx * 255 // w),
                      rng.randint(0, 256, (h, w))], -1).astype(np.uint8)
    label = ((yy // 9 + xx // 11) % NUM_CLASSES).astype(np.uint8)
    label[:2, :3] = IGNORE
    out.append(('img_%02d' % i, image, label))
  return out


def write_tiny_dataset(root, split='val', pairs=None, dataset_name='tiny'):
  """Writes PNGs and converts them to `root/tfrecord`; returns that folder."""
  pairs = pairs or tiny_images()
  folder = os.path.join(root, 'raw')
  os.makedirs(folder, exist_ok=True)
  entries = []
  for name, image, label in pairs:
    image_path = os.path.join(folder, name + '.png')
    label_path = os.path.join(folder, name + '_label.png')
    Image.fromarray(image).save(image_path)
    Image.fromarray(label, 'L').save(label_path)
    entries.append(build.Entry(name, image_path, label_path))
  out = os.path.join(root, 'tfrecord')
  build.convert({split: entries}, out, build.BuildOptions(
      num_classes=NUM_CLASSES, ignore_label=IGNORE, dataset_name=dataset_name,
      class_names=('bg', 'cat', 'dog'), colormap='pascal', num_shards=2,
      num_workers=1))
  return out


def _value(name, shape, gain=1.1):
  """Deterministic weights that give varied (not constant) predictions."""
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  leaf = name.rsplit('/', 1)[-1]
  if leaf.endswith('depthwise_weights'):
    return rng.normal(0, gain * math.sqrt(1.0 / (shape[0] * shape[1])), shape)
  if leaf.endswith('weights'):
    return rng.normal(0, gain * math.sqrt(1.0 / np.prod(shape[:-1])), shape)
  if leaf in ('gamma', 'moving_variance'):
    return rng.uniform(0.8, 1.2, shape)
  if leaf in ('beta', 'biases', 'moving_mean'):
    return rng.normal(0, 0.05, shape)
  raise ValueError('no rule for variable %s' % name)


def _balance_logits_biases(sess, images_ph, logits, variables, calibration):
  """Sets logits biases so every class is argmax somewhere.

  With random weights one class wins everywhere (the features share a large
  positive mean); subtracting each class's mean logit over the calibration
  images makes the predictions depend on the image.
  """
  biases = [v for v in variables if v.op.name == 'logits/semantic/biases'][0]
  sess.run(biases.initializer, {biases.initializer.inputs[1]:
                                np.zeros(biases.shape.as_list())})
  means = []
  for image in calibration:
    h, w = image.shape[:2]
    size = (-(-(h - 1) // 8) * 8 + 1, -(-(w - 1) // 8) * 8 + 1)
    padded = np.full((1,) + size + (3,), 127.5, np.float32)
    padded[0, :h, :w] = image
    means.append(sess.run(logits, {images_ph: padded}).mean(axis=(0, 1, 2)))
  sess.run(biases.initializer,
           {biases.initializer.inputs[1]: -np.mean(means, axis=0)})


def write_checkpoint(logdir, model_options, step=7, save_config=True,
                     calibration=None):
  """Builds the model graph, sets deterministic weights, saves.

  Args:
    logdir: folder of the checkpoint (and deeplab_config.json).
    model_options: ModelOptions.
    step: global step of the checkpoint.
    save_config: also write deeplab_config.json as deeplab-train does.
    calibration: uint8 images the logits biases are balanced on (default:
      the tiny dataset's images).

  Returns:
    The checkpoint prefix.
  """
  if calibration is None:
    calibration = [image for _, image, _ in tiny_images()]
  os.makedirs(logdir, exist_ok=True)
  with tf.Graph().as_default():
    images = tf.placeholder(tf.float32, [1, None, None, 3])
    logits = deeplab.multi_scale_logits(
        images, model_options.replace(crop_size=None))
    logits = logits[deeplab.OUTPUT_TYPE][deeplab.MERGED_LOGITS_SCOPE]
    variables = tf.global_variables()
    global_step = tf.train.get_or_create_global_step()
    # One run feeding every initial value (per-variable loads are slow).
    feed = {var.initializer.inputs[1]: _value(var.op.name,
                                              var.shape.as_list())
            for var in variables}
    feed[global_step.initializer.inputs[1]] = step
    with tf.Session() as sess:
      sess.run([v.initializer for v in variables + [global_step]], feed)
      _balance_logits_biases(sess, images, logits, variables, calibration)
      prefix = tf.train.Saver().save(sess, os.path.join(logdir, 'model.ckpt'),
                                     global_step=step)
  if save_config:
    config.save_run_config(
        logdir, model_options, config.PreprocessOptions(crop_size=CROP),
        {'name': 'tiny', 'num_classes': NUM_CLASSES, 'ignore_label': IGNORE})
  return prefix


def run_cli(module, args):
  """Parses `args` for a cli module and runs its main; returns the exit code.

  Flags are reset first, so several commands can run in one process.
  """
  flags.FLAGS.unparse_flags()
  argv = flags.FLAGS(['prog'] + list(args))
  return module.main(argv)


@contextlib.contextmanager
def captured_stdout():
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    yield buffer


def read_png(path):
  with Image.open(path) as im:
    return np.asarray(im)
