"""One training step equals the original's (tests/reference/training_step).

The float32 results of a step depend on TensorFlow's kernels: its oneDNN
kernels against its own (Eigen) ones, and oneDNN's AVX2 against its
AVX-512 kernels, sum in different orders. The original itself gives
xception_65 (batch norm trained) losses 1.8e-5 apart with oneDNN on and
off, and updates further apart than the tolerances below. So the original
was recorded with each kind of kernel the tests run on: with oneDNN on an
AVX-512 CPU (training_step/avx512/) and on an AVX2-only CPU
(training_step/avx2/), and without oneDNN (training_step/
avx2_without_onednn/, for TF_ENABLE_ONEDNN_OPTS=0), and a test process is
compared with the recording of its own kind (`recording_kind`). The tests
turn oneDNN on as every deeplab-* command does (conftest.py).

For each recorded case (benchmarks/record_original_step.py ran the
original's train.py with these flags on one fixed batch, from the reference
checkpoint values at a given global step), our training graph, built from
the same flags by deeplab-train's own flag code, must give:
- the same total, cross-entropy and regularisation loss (1e-5 relative) and
  learning rates at steps 0, 50, 100, 101 and 1000;
- the same gradient of every trainable variable after the gradient
  multipliers, and the same change of every variable in the update
  (batch-norm moving statistics included): within 1e-4 of each variable's
  scale, or within a small multiple of our own float32 noise floor where
  that is larger (see `_noise_floor`: where a ReLU's input is within
  rounding of 0 the gradients of two faithful float32 implementations
  differ by more than 1e-4, and so do ours when the input moves by a
  thousandth of a grey level; mobilenet_v2 with batch norm frozen agrees
  to 1e-5, xception_65 to 0.5 % and mobilenet_v2 with batch norm trained
  to a few % on near-zero gradients, all within the floor);
- the same initializer (kind and constants) for every variable of a fresh
  graph, and fresh values of the same mean and spread.

ASPP's dropout is the identity on both sides (the recorder's note says why).
"""
import json
import os
import pathlib

from absl import flags
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.cli import common_flags
from deeplab_train.cli import train as train_cli
from deeplab_train.model import deeplab
from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.train import graph as graph_lib

import initializer_facts
import reference_checkpoint
import step_digest
import train_testing as tt

FLAGS = flags.FLAGS
NUM_CLASSES = 21
LOSS_RTOL = 1e-5
VALUE_RTOL = 1e-4
# The noise floor: our own result under input changes of +-NUDGE grey
# levels, the worst of NUM_NUDGES runs, times a factor: 3 for batch-norm
# moving statistics (rounding of the forward pass only), 6 for gradients
# and the weight updates made of them (where one ReLU flip moves a channel,
# and a few nudges see only some of the flips). The worst ratios seen were
# 1.7 and 4.9 (xception_65 with batch norm training on two clones).
MOVING_STATISTICS = ('moving_mean', 'moving_variance')
NUDGE = 1e-3
# Four: with two, the floor of xception_65 with batch norm frozen (folded
# into the convolutions, oneDNN kernels) left three updates 1.03-1.3x over
# it, though they are 2-400x closer to the original than the original's own
# results with and without oneDNN are to each other.
NUM_NUDGES = 4
STATISTICS_NOISE_FACTOR = 3.0
GRADIENT_NOISE_FACTOR = 6.0


def recording_kind(features, onednn):
  """The recording of the original to compare with on a CPU of `features`
  (runtime/cpu.cpu_features) with TensorFlow's oneDNN kernels on or off:
  with oneDNN 'avx512' where the CPU has AVX-512, else 'avx2' (the nearest
  for a CPU with neither); without it 'avx2_without_onednn' (the only
  recording without oneDNN)."""
  if not onednn:
    return 'avx2_without_onednn'
  return 'avx512' if features['avx512f'] else 'avx2'


def onednn_enabled():
  """Whether this process's TensorFlow runs its oneDNN kernels."""
  # pylint: disable-next=g-import-not-at-top
  from tensorflow.python.util import _pywrap_util_port
  return bool(_pywrap_util_port.IsMklEnabled())


def _recording_dir(reference_dir):
  return (reference_dir / 'training_step' /
          recording_kind(cpu_lib.machine_cpu(), onednn_enabled()))


def _cases(recording_dir):
  with open(recording_dir / 'cases.json') as f:
    return json.load(f)


def _case_names():
  # Parametrisation happens before fixtures exist: the folder by path.
  return sorted(_cases(_recording_dir(
      pathlib.Path(__file__).parent / 'reference')))


def _options_from_argv(argv):
  """(ModelOptions, TrainOptions) from the original's command line, parsed
  by deeplab-train's flags."""
  FLAGS.unparse_flags()
  try:
    FLAGS(['deeplab-train'] + [a for a in argv
                               if not a.startswith('--dataset')])
    crop = common_flags.parse_int_list(FLAGS.train_crop_size,
                                       'train_crop_size')
    return (common_flags.model_options(NUM_CLASSES, crop),
            train_cli.train_options())
  finally:
    FLAGS.unparse_flags()


def _input_fn(images, labels):
  """The fixed batch, its images replaceable through a feed."""
  def input_fn():
    return {'image': tf.placeholder_with_default(images, images.shape,
                                                 name='fixed_images'),
            'label': tf.constant(labels)}
  return input_fn


def _build(case_argv, facts, monkeypatch):
  monkeypatch.setattr(deeplab, 'DROPOUT_KEEP_PROB', 1.0)
  # At the cases' small crops no input reaches the size from which the
  # training towers compute a convolution's filter gradient from patches
  # (layers.filter_gradient_as_matmul); from any size, so that the cases
  # check that form too (xception_65's entry_flow/conv1_2).
  monkeypatch.setattr(layers, 'MIN_PATCH_GRADIENT_PIXELS', 1)
  model_options, train_options = _options_from_argv(case_argv)
  images = facts['images'].astype(np.float32)
  labels = facts['labels'].astype(np.int32)
  return graph_lib.build_training_graph(
      model_options, train_options, ignore_label=255,
      input_fn=_input_fn(images, labels))


def _model_variables(g):
  return [v for v in g.model_variables if v is not g.global_step]


def _unpack(facts, kind):
  return dict(zip(facts[kind + '_names'].tolist(), facts[kind + '_digests']))


@pytest.fixture(scope='module', params=_case_names())
def case(request, reference_dir):
  name = request.param
  folder = _recording_dir(reference_dir)
  facts = dict(np.load(folder / (name + '.npz')))
  return name, _cases(folder)[name]['argv'], facts


@pytest.fixture(scope='module')
def ours(case):
  return run_ours(*case)


class _Restart:
  """Puts every variable back as at the start of the step, with ops built
  once (an assign per model variable, reused for every run)."""

  def __init__(self, g, variables, start):
    assign, self._feeds = tt.assign_from_values(
        g.graph, variables, lambda v: start[v.op.name])
    with g.graph.as_default():
      chosen = set(variables)
      # Momentum slots at 0 (and the rest of the optimizer's state fresh).
      others = [v for v in tf.global_variables() if v not in chosen]
      self._ops = [assign, tf.variables_initializer(others)]

  def __call__(self, sess):
    sess.run(self._ops, self._feeds)


def _one_step(sess, g, variables, start, restart, step, images):
  """Losses and digests of the gradients and of the update, from `start`."""
  feed = {g.graph.get_tensor_by_name('input/fixed_images:0'): images}
  restart(sess)
  g.global_step.load(step, sess)
  before = sess.run({
      'total': g.total_loss, 'ce': g.data_loss,
      'reg': g.regularization_loss,
      'grads': {v.op.name: grad for grad, v in g.grads_and_vars}}, feed)
  sess.run(g.train_op, feed)
  after = sess.run({v.op.name: v for v in variables})
  update = {n: a.astype(np.float64) - start[n] for n, a in after.items()}
  return {'losses': before, 'grad': step_digest.digests(before['grads']),
          'update': step_digest.digests(update)}


def _update_floors(start):
  """{name: scale floor} of updates: a change is only seen to the float32
  spacing of the variable's values (a few spacings, over VALUE_RTOL)."""
  return {name: 4 * float(np.spacing(np.abs(value).max().astype(np.float32)))
          / VALUE_RTOL for name, value in start.items()}


def run_ours(name, argv, facts):
  """Our losses, learning rates, gradient and update digests, and their
  float32 noise floor (see `_noise_floor`)."""
  del name
  with pytest.MonkeyPatch.context() as monkeypatch:
    g = _build(argv, facts, monkeypatch)
  variables = _model_variables(g)
  start = {v.op.name: reference_checkpoint.value_for(v.op.name,
                                                     v.shape.as_list())
           for v in variables}
  images = facts['images'].astype(np.float32)
  step = int(facts['global_step'])
  with tf.Session(graph=g.graph) as sess:
    sess.run(tf.global_variables_initializer())
    fresh = initializer_facts.record(sess, variables)
    rates = []
    for s in facts['learning_rate_steps']:
      g.global_step.load(int(s), sess)
      rates.append(sess.run(g.learning_rate))
    restart = _Restart(g, variables, start)
    out = _one_step(sess, g, variables, start, restart, step, images)
    rng = np.random.default_rng(0)
    nudges = [rng.uniform(-NUDGE, NUDGE, images.shape).astype(np.float32)
              for _ in range(NUM_NUDGES)]
    nudged = [_one_step(sess, g, variables, start, restart, step,
                        images + nudge) for nudge in nudges]
  out['rates'] = np.array(rates)
  out['fresh'] = fresh
  out['sizes'] = {v.op.name: v.shape.num_elements() for v in variables}
  out['grad_floors'], out['update_floors'] = {}, _update_floors(start)
  for kind in ('grad', 'update'):
    out[kind + '_noise'] = _noise_floor(
        out[kind], [n[kind] for n in nudged], out[kind + '_floors'])
  return out


def _noise_floor(digests, nudged_digests, scale_floors):
  """{name: relative error} of our own result under rounding-level input
  changes, the worst over the nudged runs.

  Where a ReLU's input is within rounding of 0 (batch norm in training
  mode makes them common), two float32 implementations of the same maths
  may send it opposite ways; its gradient then goes to 0 on one side only,
  and batch norm's backward pass spreads that over the whole channel. Our
  own graph shows the size of that effect when its input moves by
  NUDGE grey levels.
  """
  floor = dict.fromkeys(digests, 0.0)
  for nudged in nudged_digests:
    for name in digests:
      bad = step_digest.mismatches({name: nudged[name]},
                                   {name: digests[name]}, 0.0, scale_floors)
      floor[name] = max(floor[name], bad[0][0] if bad else 0.0)
  return floor


def _beyond_tolerance(got, want, noise, scale_floors):
  """(error, allowed, name) where ours and the original differ by more than
  VALUE_RTOL and a factor times our own noise floor."""
  bad = []
  for name in sorted(want):
    found = step_digest.mismatches({name: got[name]}, {name: want[name]},
                                   0.0, scale_floors)
    error = found[0][0] if found else 0.0
    factor = (STATISTICS_NOISE_FACTOR if name.endswith(MOVING_STATISTICS)
              else GRADIENT_NOISE_FACTOR)
    allowed = max(VALUE_RTOL, factor * noise[name])
    if not error <= allowed:
      bad.append((error, allowed, name))
  return sorted(bad, reverse=True)


def test_losses_equal_the_original(case, ours):
  _, _, facts = case
  got = ours['losses']
  np.testing.assert_allclose(got['total'], facts['total_loss'],
                             rtol=LOSS_RTOL)
  np.testing.assert_allclose(got['ce'], facts['cross_entropy'],
                             rtol=LOSS_RTOL)
  np.testing.assert_allclose(got['reg'], facts['regularization_loss'],
                             rtol=LOSS_RTOL)


def test_learning_rates_equal_the_original(case, ours):
  _, _, facts = case
  np.testing.assert_allclose(ours['rates'], facts['learning_rates'],
                             rtol=1e-6)


@pytest.mark.parametrize('kind', ['grad', 'update'])
def test_gradients_and_update_equal_the_original(case, ours, kind):
  """Every gradient (after the multipliers) and the change of every
  variable in the update, batch-norm moving statistics included."""
  _, _, facts = case
  want = _unpack(facts, kind)
  assert sorted(ours[kind]) == sorted(want)
  bad = _beyond_tolerance(ours[kind], want, ours[kind + '_noise'],
                          ours[kind + '_floors'])
  assert not bad, '%s differs (error, allowed, variable): %s' % (kind,
                                                                 bad[:10])


def test_fresh_variables_are_initialised_as_the_original(case, ours):
  """Same initializer kind and constants; fresh values of the same mean and
  spread (tensors of 4096+ values, where the spread is a stable statistic)."""
  _, _, facts = case
  got = ours['fresh']
  names = facts['init_names'].tolist()
  assert got['init_names'].tolist() == names
  kinds = [initializer_facts.KINDS[k] for k in facts['init_kinds']]
  got_kinds = [initializer_facts.KINDS[k] for k in got['init_kinds']]
  differ = [(n, w, k) for n, w, k in zip(names, kinds, got_kinds) if w != k]
  assert not differ, 'initializer kinds differ (name, original, ours): %s' % (
      differ[:10],)
  for i, name in enumerate(names):
    np.testing.assert_allclose(got['init_consts'][i], facts['init_consts'][i],
                               rtol=1e-6, err_msg=name)
  for i, name in enumerate(names):
    if ours['sizes'][name] >= 4096:
      mean, std = facts['init_stats'][i]
      np.testing.assert_allclose(got['init_stats'][i][1], std, rtol=0.1,
                                 err_msg=name)
      assert abs(got['init_stats'][i][0] - mean) <= 0.1 * std, name


def _flags_without_paths(argv):
  return [a for a in argv if not a.startswith(('--train_logdir',
                                                '--dataset_dir'))]


def test_every_cpu_kind_has_a_recording_of_the_same_cases(reference_dir):
  recordings = {}
  for kind in ('avx512', 'avx2', 'avx2_without_onednn'):
    folder = reference_dir / 'training_step' / kind
    cases = _cases(folder)
    recordings[kind] = {name: _flags_without_paths(c['argv'])
                        for name, c in cases.items()}
    for name in cases:
      assert (folder / (name + '.npz')).is_file(), (kind, name)
  assert (recordings['avx512'] == recordings['avx2']
          == recordings['avx2_without_onednn'])
  avx512 = cpu_lib.cpu_features('flags : fpu avx2 avx512f avx512_bf16')
  avx2 = cpu_lib.cpu_features('flags : fpu avx avx2')
  assert recording_kind(avx512, onednn=True) == 'avx512'
  assert recording_kind(avx2, onednn=True) == 'avx2'
  assert recording_kind(cpu_lib.cpu_features('flags : fpu sse4_2'),
                        onednn=True) == 'avx2'
  assert recording_kind(avx2, onednn=False) == 'avx2_without_onednn'
  assert recording_kind(avx512, onednn=False) == 'avx2_without_onednn'
  # The tests run with the commands' setting (conftest.py): oneDNN on,
  # unless TF_ENABLE_ONEDNN_OPTS says otherwise.
  if os.environ.get(cpu_lib.ONEDNN_ENV) == '1':
    assert onednn_enabled()
