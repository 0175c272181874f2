"""Records one training step of the original DeepLab as reference facts.

Run with the original's environment (DIR made by ../shared/original/setup.sh
on our machines; any checkout of the original's research/deeplab at upstream
commit 4456f24 ported to current TensorFlow works):

    source DIR/env.sh
    python benchmarks/record_original_step.py \\
        --out tests/reference/training_step/KIND

with TF_ENABLE_ONEDNN_OPTS=1 (as every deeplab-* command and the tests run
TensorFlow). KIND is avx512 or avx2, the kind of CPU this runs on, or
avx2_without_onednn when recorded with TF_ENABLE_ONEDNN_OPTS=0: oneDNN's
float32 kernels differ from TensorFlow's own and between the two kinds
of CPU, and so do the original's results; the test compares a process
with the recording of its own kind.

For each case below it runs the original's own train.py `main` with the
case's flags, with three measuring points patched in and nothing else: the
dataset yields one fixed, already preprocessed batch (stored beside the
facts); the momentum optimizer's `apply_gradients` records the gradients it
is given (after the original's gradient multipliers); and instead of the
training loop, one step is run by hand from the reference checkpoint values
(tests/reference_checkpoint.py) at a given global step. ASPP's dropout is
replaced by the identity, because its random mask cannot be reproduced by
another implementation; everything else is the original's graph.

Written per case (CASE.npz): the batch, total / cross-entropy /
regularisation loss, the learning rate at a few steps, and digests
(tests/step_digest.py) of every gradient and of the change of every
variable in the update (batch-norm moving statistics included), plus the
initializer of every variable of the fresh graph (kind, constants, mean and
std of the fresh values). cases.json lists the flags of each case.
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import types

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / 'tests'))

import initializer_facts  # noqa: E402  pylint: disable=g-import-not-at-top
import reference_checkpoint  # noqa: E402  pylint: disable=g-import-not-at-top
import step_digest  # noqa: E402  pylint: disable=g-import-not-at-top

NUM_CLASSES = 21  # --dataset=pascal_voc_seg
LR_STEPS = (0, 50, 100, 101, 1000)
SCHEDULE = ['--learning_policy=poly', '--base_learning_rate=0.007',
            '--training_number_of_steps=1500', '--slow_start_step=100',
            '--slow_start_learning_rate=0.0005', '--weight_decay=0.00004']
WEIGHTS = ['--label_weights=%g' % (0.5 + 0.5 * (i % 4))
           for i in range(NUM_CLASSES)]
XCEPTION = ['--model_variant=xception_65', '--output_stride=16',
            '--atrous_rates=6', '--atrous_rates=12', '--atrous_rates=18',
            '--decoder_output_stride=4']

# name -> (flags, batch size, crop, global step of the checkpoint)
CASES = {
    'mobilenet_v2_os8_bn': (
        ['--model_variant=mobilenet_v2', '--output_stride=8',
         '--depth_multiplier=0.5', '--fine_tune_batch_norm=true',
         '--upsample_logits=true'] + SCHEDULE, 4, 65, 0),
    'mobilenet_v2_os8_frozen_bn_weights_topk_two_clones': (
        ['--model_variant=mobilenet_v2', '--output_stride=8',
         '--depth_multiplier=0.5', '--fine_tune_batch_norm=false',
         '--upsample_logits=false', '--top_k_percent_pixels=0.5',
         '--hard_example_mining_step=100', '--num_clones=2',
         '--clone_on_cpu=true'] + WEIGHTS + SCHEDULE, 4, 65, 50),
    'xception_65_os16_dec4_frozen_bn': (
        XCEPTION + ['--fine_tune_batch_norm=false', '--upsample_logits=true',
                    '--last_layer_gradient_multiplier=2']
        + SCHEDULE[:-3] + ['--weight_decay=0.00004'], 2, 65, 200),
    'xception_65_os16_dec4_bn_weights_topk_two_clones': (
        XCEPTION + ['--fine_tune_batch_norm=true', '--upsample_logits=false',
                    '--top_k_percent_pixels=0.25',
                    '--hard_example_mining_step=0', '--num_clones=2',
                    '--clone_on_cpu=true'] + WEIGHTS + SCHEDULE, 4, 65, 101),
}


def fixed_batch(batch, crop, seed):
  """(uint8 images [B,S,S,3], uint8 labels [B,S,S,1]) like a preprocessed
  crop: noise images, 8x8 label tiles, an ignored band of padding."""
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (batch, crop, crop, 3)).astype(np.uint8)
  tiles = rng.integers(0, NUM_CLASSES, (batch, crop // 8 + 1, crop // 8 + 1))
  labels = np.kron(tiles, np.ones((1, 8, 8), np.int64))[:, :crop, :crop]
  labels[:, crop - 9:, :] = 255
  images[:, crop - 9:, :, :] = 128
  return images, labels[..., None].astype(np.uint8)


class _FixedDataset(object):
  """Stands in for the original's data_generator.Dataset: each get_next()
  call (one per clone) takes the next share of the fixed batch."""

  def __init__(self, tf, images, labels, batch_size, **unused):
    self._tf, self._images, self._labels = tf, images, labels
    self._share = batch_size
    self._taken = 0
    self.num_of_classes = NUM_CLASSES
    self.ignore_label = 255

  def get_one_shot_iterator(self):
    return self

  def get_next(self):
    start, self._taken = self._taken, self._taken + self._share
    tf = self._tf
    return {
        'image': tf.constant(self._images[start:self._taken], tf.float32),
        'label': tf.constant(self._labels[start:self._taken], tf.int32)}


def record_case(name, case, out_dir):
  """Runs the original's main for one case; writes out_dir/name.npz."""
  flags_list, batch, crop, step = case
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  from deeplab import model  # pylint: disable=g-import-not-at-top
  from deeplab import train  # pylint: disable=g-import-not-at-top
  from deeplab.utils import train_utils  # pylint: disable=g-import-not-at-top

  images, labels = fixed_batch(batch, crop, seed=len(name))
  seen = {}

  def dataset(**kwargs):
    return _FixedDataset(tf, images, labels, **kwargs)

  original_lr = train_utils.get_model_learning_rate

  def learning_rate(*args, **kwargs):
    seen['learning_rate'] = original_lr(*args, **kwargs)
    return seen['learning_rate']

  original_apply = tf.train.MomentumOptimizer.apply_gradients

  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    seen['grads_and_vars'] = list(grads_and_vars)
    return original_apply(self, seen['grads_and_vars'], *args, **kwargs)

  def one_step(train_tensor, **unused):
    seen['facts'] = _run_one_step(tf, train_tensor, seen, step,
                                  train.FLAGS.num_clones)

  train.data_generator.Dataset = dataset
  train.train_utils.get_model_learning_rate = learning_rate
  tf.train.MomentumOptimizer.apply_gradients = apply_gradients
  # model.py's own view of slim, with its one dropout call an identity.
  slim_view = types.SimpleNamespace(
      **{k: getattr(model.slim, k) for k in dir(model.slim)
         if not k.startswith('__')})
  slim_view.dropout = lambda inputs, *a, **k: inputs
  model.slim = slim_view
  train.slim.learning.train = one_step
  logdir = tempfile.mkdtemp()
  argv = ['train.py', '--train_logdir=' + logdir, '--dataset_dir=' + logdir,
          '--dataset=pascal_voc_seg', '--train_batch_size=%d' % batch,
          '--train_crop_size=%d,%d' % (crop, crop)] + flags_list
  train.FLAGS.unparse_flags()
  train.FLAGS(argv)
  try:
    train.main(None)
  finally:
    tf.train.MomentumOptimizer.apply_gradients = original_apply
  facts = seen['facts']
  facts['images'], facts['labels'] = images, labels
  facts['global_step'] = np.int64(step)
  np.savez_compressed(out_dir / (name + '.npz'), **facts)
  return argv[1:]


def _run_one_step(tf, train_tensor, seen, step, num_clones):
  """Loads the reference values, runs one step, returns the facts."""
  graph = train_tensor.graph
  global_step = tf.train.get_global_step(graph)
  grads_and_vars = seen['grads_and_vars']
  variables = [v for v in graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
               if v is not global_step and not v.op.name.endswith('Momentum')]
  facts = {}
  # The original's own session config (its clones may name a GPU).
  config = tf.ConfigProto(allow_soft_placement=True)
  with tf.Session(graph=graph, config=config) as sess:
    sess.run(tf.global_variables_initializer())
    facts.update(initializer_facts.record(sess, variables))
    start = {v.op.name: reference_checkpoint.value_for(
        v.op.name, v.shape.as_list()) for v in variables}
    for var in variables:
      var.load(start[var.op.name], sess)
    lrs = []
    for s in LR_STEPS:
      global_step.load(s, sess)
      lrs.append(sess.run(seen['learning_rate']))
    global_step.load(step, sess)
    # Each clone's cross-entropy counts 1/num_clones in the total.
    ce = tf.add_n(graph.get_collection(tf.GraphKeys.LOSSES)) / num_clones
    reg = tf.add_n(graph.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
    total = train_tensor.op.inputs[0]  # the loss, without the update
    before = sess.run({'total': total, 'ce': ce, 'reg': reg,
                       'grads': {v.op.name: g for g, v in grads_and_vars}})
    after_loss = sess.run(train_tensor)
    after = sess.run({v.op.name: v for v in variables})
    update = {n: after[n].astype(np.float64) - start[n] for n in after}
    assert int(sess.run(global_step)) == step + 1
  assert np.isclose(after_loss, before['total'], rtol=1e-6)
  facts['total_loss'] = np.float64(before['total'])
  facts['cross_entropy'] = np.float64(before['ce'])
  facts['regularization_loss'] = np.float64(before['reg'])
  facts['learning_rate_steps'] = np.array(LR_STEPS, np.int64)
  facts['learning_rates'] = np.array(lrs, np.float64)
  _put(facts, 'grad', step_digest.digests(before['grads']))
  _put(facts, 'update', step_digest.digests(update))
  return facts


def _put(facts, kind, named):
  names = sorted(named)
  facts[kind + '_names'] = np.array(names)
  facts[kind + '_digests'] = np.stack([named[n] for n in names])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--cases', nargs='*', default=sorted(CASES))
  args = parser.parse_args()
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  index_path = out_dir / 'cases.json'
  index = json.loads(index_path.read_text()) if index_path.exists() else {}
  for name in args.cases:
    print('recording', name, flush=True)
    index[name] = {'argv': record_case(name, CASES[name], out_dir)}
  index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + '\n')


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main()
