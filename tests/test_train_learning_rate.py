"""Learning-rate schedules (poly, step, cosine, slow start) against numpy."""
import math

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import config
from deeplab_train.train import learning_rate

import train_testing as tt

STEPS = [0, 1, 49, 50, 51, 99, 100, 250, 599, 999, 1000, 1500]


def _rates(options):
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    rate = learning_rate.learning_rate(step, options)
    with tf.Session() as sess:
      return np.array([sess.run(rate, {step: s}) for s in STEPS])


def _expected(policy, base=0.01, total=1000, slow=0, slow_lr=1e-4,
              power=0.9, factor=0.1, decay_step=300):
  out = []
  for step in STEPS:
    s = max(step - slow, 0)
    horizon = total - slow
    p = min(s, horizon) / horizon
    if policy == 'poly':
      rate = base * (1 - p) ** power
    elif policy == 'step':
      rate = base * factor ** math.floor(s / decay_step)
    else:
      rate = base * 0.5 * (1 + math.cos(math.pi * p))
    out.append(slow_lr if step < slow else rate)
  return np.array(out)


@pytest.mark.parametrize('policy', ['poly', 'step', 'cosine'])
@pytest.mark.parametrize('slow', [0, 50])
def test_schedule_matches_formula(policy, slow):
  options = config.TrainOptions(
      learning_policy=policy, base_learning_rate=0.01,
      training_number_of_steps=1000, slow_start_step=slow,
      slow_start_learning_rate=1e-4, learning_power=0.9,
      learning_rate_decay_factor=0.1, learning_rate_decay_step=300).validate()
  np.testing.assert_allclose(_rates(options), _expected(policy, slow=slow),
                             rtol=1e-5, atol=1e-9)  # float32 near 0


def test_poly_reaches_zero_and_stays_there():
  options = config.TrainOptions(learning_policy='poly', base_learning_rate=1.0,
                                training_number_of_steps=1000)
  rates = _rates(options)
  assert rates[STEPS.index(1000)] == 0.0
  assert rates[STEPS.index(1500)] == 0.0


@pytest.mark.parametrize('decay_steps,end', [(600, 0.0), (0, 0.002),
                                             (2000, 0.001)])
def test_poly_decay_steps_and_end_rate_follow_tensorflows_polynomial_decay(
    decay_steps, end):
  """--decay_steps and --end_learning_rate as the original used them:
  tf.train.polynomial_decay over the steps after the slow start."""
  options = config.TrainOptions(
      learning_policy='poly', base_learning_rate=0.01,
      training_number_of_steps=1000, slow_start_step=50,
      slow_start_learning_rate=1e-4, decay_steps=decay_steps,
      end_learning_rate=end).validate()
  with tf.Graph().as_default():
    step = tf.placeholder(tf.int64, [])
    adjusted = tf.maximum(step - 50, 0)
    want = tf.where(step < 50, 1e-4, tf.train.polynomial_decay(
        0.01, adjusted, decay_steps or 950, end_learning_rate=end, power=0.9))
    with tf.Session() as sess:
      expected = np.array([sess.run(want, {step: s}) for s in STEPS])
  np.testing.assert_allclose(_rates(options), expected, rtol=1e-5, atol=1e-9)


def test_adam_uses_its_own_constant_rate():
  from deeplab_train.train import graph as graph_lib  # pylint: disable=g-import-not-at-top
  options = config.TrainOptions(optimizer='adam', adam_learning_rate=0.003,
                                adam_epsilon=1e-6).validate()
  optimizer = graph_lib._optimizer(options, tf.constant(0.5))  # pylint: disable=protected-access
  assert isinstance(optimizer, tf.train.AdamOptimizer)
  assert optimizer._lr == 0.003 and optimizer._epsilon == 1e-6  # pylint: disable=protected-access
  with pytest.raises(config.ConfigError, match='optimizer'):
    config.TrainOptions(optimizer='sgd').validate()
  # The rate the log and the summaries show is Adam's (it was the schedule's,
  # which sets no rate for Adam), and flags of the schedule are named.
  scheduled = options.replace(base_learning_rate=0.5, learning_policy='step')
  np.testing.assert_allclose(_rates(scheduled), 0.003, rtol=1e-6)
  warnings = config.check_training_setup(
      tt.tiny_model_options(), scheduled.replace(
          fine_tune_batch_norm=False))
  assert warnings == [
      '{TrainOptions.optimizer}=adam trains at the constant '
      '{TrainOptions.adam_learning_rate}=0.003, as in the original: '
      '{TrainOptions.base_learning_rate}, {TrainOptions.learning_policy} set '
      'no rate for it']
  assert not config.check_training_setup(
      tt.tiny_model_options(), options.replace(
          fine_tune_batch_norm=False))


def test_slow_start_over_the_whole_run_warns_and_keeps_the_slow_rate(caplog):
  """The original accepted a slow start as long as the run (or longer)."""
  options = config.TrainOptions(
      learning_policy='poly', base_learning_rate=0.01,
      training_number_of_steps=100, slow_start_step=100,
      slow_start_learning_rate=1e-4).validate()
  with caplog.at_level('WARNING'):
    rates = _rates(options)
  assert 'the whole run trains at slow_start_learning_rate' in caplog.text
  below = [r for s, r in zip(STEPS, rates) if s < 100]
  np.testing.assert_allclose(below, 1e-4, rtol=1e-6)
  assert np.all(np.isfinite(rates))
  with pytest.raises(config.ConfigError, match='slow_start_step must be >= 0'):
    config.TrainOptions(slow_start_step=-1).validate()
