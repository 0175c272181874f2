"""Checkpoints with the reference value rule, written from a manifest.

The numeric references in tests/reference/ were produced by the original
DeepLab from a checkpoint whose every value follows one deterministic rule
(tests/reference/README.md states it). This module is the project's own
writer of that rule: `value_for` gives one variable's value, and
`write_checkpoint` saves every variable of a manifest (plus `global_step`)
under a checkpoint prefix, so that our graph can restore the same weights
by name. Run as a script: `python reference_checkpoint.py MANIFEST PREFIX`.
"""
import argparse
import json
import math
import sys
import zlib

import numpy as np

WEIGHT_GAIN = 1.1
BIAS_SCALE = 1.0


def value_for(name, shape, weight_gain=WEIGHT_GAIN, bias_scale=BIAS_SCALE):
  """The reference value of one variable (float32).

  Args:
    name: the variable's name, e.g. 'logits/semantic/weights'.
    shape: its shape.
    weight_gain: multiplies the standard deviation of (depthwise) weights.
    bias_scale: multiplies the standard deviation of biases and beta.

  Returns:
    A float32 array of `shape`.

  Raises:
    ValueError: the name's last part has no rule, or depthwise weights
      are not 4-D.
  """
  shape = tuple(int(d) for d in shape)
  # One generator per variable, seeded by its name, one draw call each.
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  leaf = name.rsplit('/', 1)[-1]
  if leaf.endswith('depthwise_weights'):
    if len(shape) != 4:
      raise ValueError('%s: depthwise weights of shape %s are not 4-D'
                       % (name, shape))
    std = weight_gain * math.sqrt(1.0 / (shape[0] * shape[1]))
    value = rng.normal(0.0, std, shape)
  elif leaf.endswith('weights'):
    fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    value = rng.normal(0.0, weight_gain * math.sqrt(1.0 / fan_in), shape)
  elif leaf.endswith(('biases', 'beta')):
    value = rng.normal(0.0, 0.05 * bias_scale, shape)
  elif leaf.endswith(('gamma', 'moving_variance')):
    value = rng.uniform(0.8, 1.2, shape)
  elif leaf.endswith('moving_mean'):
    value = rng.normal(0.0, 0.05, shape)
  else:
    raise ValueError('no reference value rule for variable %s' % name)
  return np.asarray(value, np.float32)


def load_manifest(path):
  with open(path) as f:
    return json.load(f)


def write_checkpoint(manifest, prefix, weight_gain=WEIGHT_GAIN,
                     bias_scale=BIAS_SCALE):
  """Saves every variable of `manifest` with its reference value.

  Args:
    manifest: a loaded manifest ({'variables': [[name, shape], ...], ...}).
    prefix: the checkpoint prefix to write (its folder is created).
    weight_gain, bias_scale: as for `value_for`.

  Returns:
    The saved prefix.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  graph = tf.Graph()
  with graph.as_default():
    variables = [tf.Variable(tf.zeros(shape, tf.float32), name=name)
                 for name, shape in manifest['variables']]
    step = tf.Variable(tf.zeros([], tf.int64), name='global_step',
                       trainable=False)
    saver = tf.train.Saver(variables + [step])
    # Feeding each initializer's value input assigns the value in one run
    # and keeps the (large) values out of the graph.
    feed = {}
    for var, (name, shape) in zip(variables, manifest['variables']):
      assert var.op.name == name, (var.op.name, name)
      feed[var.initializer.inputs[1]] = value_for(
          name, shape, weight_gain, bias_scale)
    with tf.Session(graph=graph) as sess:
      sess.run([v.initializer for v in variables], feed)
      sess.run(step.initializer)
      return saver.save(sess, str(prefix), write_meta_graph=False)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('manifest')
  parser.add_argument('prefix')
  parser.add_argument('--weight_gain', type=float, default=WEIGHT_GAIN)
  parser.add_argument('--bias_scale', type=float, default=BIAS_SCALE)
  args = parser.parse_args(argv)
  path = write_checkpoint(load_manifest(args.manifest), args.prefix,
                          args.weight_gain, args.bias_scale)
  print(path)


if __name__ == '__main__':
  sys.exit(main())
