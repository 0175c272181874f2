"""Learning-rate schedules of the original trainer, keyed on the global step.

All schedules count from the end of the slow start: with
`s = max(step - slow_start_step, 0)` and `T = decay_steps`, or
`training_number_of_steps - slow_start_step` when decay_steps is 0,

  poly:   (base - end) * (1 - min(s, T) / T) ** learning_power + end
          (end = end_learning_rate)
  step:   base * learning_rate_decay_factor
            ** floor(s / learning_rate_decay_step)
  cosine: base * 0.5 * (1 + cos(pi * min(s, T) / T))

and before `slow_start_step` the rate is `slow_start_learning_rate`. Because
the rate is a function of the global step only, a resumed run continues the
same schedule. With optimizer='adam' the rate is the constant
`adam_learning_rate`, as the original's Adam trains: that is the rate the
log and the summaries show.
"""
import logging
import math

import tensorflow.compat.v1 as tf

from deeplab_train.config import errors


def learning_rate(global_step, options):
  """The learning-rate tensor.

  Args:
    global_step: int64 scalar tensor.
    options: TrainOptions (optimizer, adam_learning_rate, learning_policy,
      base_learning_rate,
      learning_rate_decay_factor, learning_rate_decay_step, learning_power,
      training_number_of_steps, slow_start_step, slow_start_learning_rate,
      decay_steps, end_learning_rate).

  Returns:
    float32 scalar tensor.

  Raises:
    ValueError: unknown learning policy.
  """
  with tf.name_scope('learning_rate'):
    if options.optimizer == 'adam':
      return tf.constant(options.adam_learning_rate, tf.float32,
                         name='value')
    step = tf.cast(global_step, tf.float32)
    s = tf.maximum(step - options.slow_start_step, 0.0)
    if options.slow_start_step >= options.training_number_of_steps:
      logging.warning(errors.Message(
          '{TrainOptions.slow_start_step}=%d is not below '
          '{TrainOptions.training_number_of_steps}=%d: the whole run trains '
          'at {TrainOptions.slow_start_learning_rate}=%g',
          options.slow_start_step, options.training_number_of_steps,
          options.slow_start_learning_rate))
    # At least one step: the rate after a slow start that never ends is
    # never used, but must not divide by 0.
    horizon = float(options.decay_steps or max(
        options.training_number_of_steps - options.slow_start_step, 1))
    base = options.base_learning_rate
    progress = tf.minimum(s, horizon) / horizon
    # (horizon - s) is exact in float32, so the rate reaches exactly 0 (a
    # division may be rewritten as a multiplication by the reciprocal).
    remaining = tf.maximum(horizon - s, 0.0) / horizon
    if options.learning_policy == 'poly':
      end = options.end_learning_rate
      rate = (base - end) * tf.pow(remaining, options.learning_power) + end
    elif options.learning_policy == 'step':
      rate = base * tf.pow(options.learning_rate_decay_factor,
                           tf.floor(s / options.learning_rate_decay_step))
    elif options.learning_policy == 'cosine':
      rate = base * 0.5 * (1.0 + tf.cos(math.pi * progress))
    else:
      raise ValueError('unknown learning policy %r' % options.learning_policy)
    if options.slow_start_step > 0:
      rate = tf.where(step < options.slow_start_step,
                      tf.constant(options.slow_start_learning_rate, tf.float32),
                      rate)
    return tf.identity(rate, name='value')
