"""Dynamic loss scaling for float16 training (`--mixed_precision=fp16`).

In float16 small gradients underflow to zero. The loss is multiplied by a
large scale before differentiation and the gradients divided by it after,
so the backward pass works with numbers in float16's range. When a
gradient comes out non-finite the scale was too large: the update is
skipped (weights, momentum and global step unchanged) and the scale halved.
After `increment_period` finite steps in a row the scale doubles again.
The batch-norm moving statistics are updated by the forward pass, skipped
step or not, as under TensorFlow's own loss scaling. Non-finite gradients
in `diverged_steps` steps in a row at the smallest scale are no overflow a
smaller scale avoids: the model diverged (`diverged`), and the trainer
stops as for a non-finite loss (the steps were skipped for ever, without
a word); a single one there (a rare batch) is skipped as any other.
This is the policy of TensorFlow's own dynamic loss scale; that class is
deprecated in TF2 in favour of a Keras optimizer wrapper, which this project
cannot use (no Keras in the graph), so the few ops are written here.

The scale and its counter are local variables: checkpoints hold exactly the
variables of an fp32 run, so fp16 and fp32 runs resume from each other's
checkpoints (a resumed fp16 run starts again from the initial scale).
"""
import tensorflow.compat.v1 as tf

DEFAULT_INITIAL_SCALE = 2.0 ** 15
DEFAULT_INCREMENT_PERIOD = 2000
DEFAULT_MULTIPLIER = 2.0
DEFAULT_DIVERGED_STEPS = 10


def _local_variable(name, initial_value, dtype):
  return tf.get_variable(
      name, initializer=tf.constant(initial_value, dtype), trainable=False,
      collections=[tf.GraphKeys.LOCAL_VARIABLES], use_resource=True)


def all_finite(tensors):
  """A bool scalar: every element of every tensor (None skipped) is finite.

  IndexedSlices are checked by their values.
  """
  checks = []
  for t in tensors:
    if t is None:
      continue
    if isinstance(t, tf.IndexedSlices):
      t = t.values
    checks.append(tf.reduce_all(tf.math.is_finite(t)))
  if not checks:
    return tf.constant(True)
  return tf.reduce_all(tf.stack(checks))


class DynamicLossScale:
  """The loss scale variable and the ops that use and update it.

  Build it once, in the graph and variable scope of the training graph:

    scale = DynamicLossScale()
    grads = tf.gradients(scale.scale_loss(loss), variables)
    grads_and_vars = scale.unscale(zip(grads, variables))
    train_op = scale.apply_gradients(optimizer, grads_and_vars, global_step)

  Args:
    initial_scale: the scale at the start (a power of two).
    increment_period: finite steps in a row before the scale is multiplied.
    multiplier: factor by which the scale grows and shrinks.
    min_scale: the scale never drops below this.
    diverged_steps: steps in a row with non-finite gradients at min_scale
      that make `diverged` true.
    name: variable scope of the variables.
  """

  def __init__(self, initial_scale=DEFAULT_INITIAL_SCALE,
               increment_period=DEFAULT_INCREMENT_PERIOD,
               multiplier=DEFAULT_MULTIPLIER, min_scale=1.0,
               diverged_steps=DEFAULT_DIVERGED_STEPS, name='loss_scale'):
    if initial_scale < min_scale or multiplier <= 1 or increment_period < 1:
      raise ValueError('bad loss scale settings: initial_scale=%g (>= %g), '
                       'multiplier=%g (> 1), increment_period=%d (>= 1)'
                       % (initial_scale, min_scale, multiplier,
                          increment_period))
    self._increment_period = increment_period
    self._multiplier = float(multiplier)
    self._min_scale = float(min_scale)
    self._diverged_steps = diverged_steps
    # Set by apply_gradients (a bool scalar tensor, see the module doc).
    self.diverged = None
    with tf.variable_scope(name):
      self.scale = _local_variable('scale', float(initial_scale), tf.float32)
      self.good_steps = _local_variable('good_steps', 0, tf.int64)
      # Steps in a row with non-finite gradients at min_scale.
      self.bad_steps = _local_variable('bad_steps_at_min_scale', 0, tf.int64)

  def scale_loss(self, loss):
    """`loss` (float32) times the current scale."""
    return loss * tf.cast(self.scale, loss.dtype)

  def unscale(self, grads_and_vars):
    """(gradient / scale, variable) pairs; None gradients stay None."""
    inverse = 1.0 / self.scale
    out = []
    for grad, var in grads_and_vars:
      if grad is not None:
        if isinstance(grad, tf.IndexedSlices):
          grad = tf.IndexedSlices(grad.values * tf.cast(inverse,
                                                        grad.dtype),
                                  grad.indices, grad.dense_shape)
        else:
          grad = grad * tf.cast(inverse, grad.dtype)
      out.append((grad, var))
    return out

  def update(self, finite):
    """The op updating the scale after a step whose gradients were `finite`.

    Finite: count the step; after `increment_period` of them multiply the
    scale (if the result is finite) and restart the count. Not finite:
    divide the scale (not below `min_scale`) and restart the count.
    """
    def grow_or_count():
      count = self.good_steps + 1
      def grow():
        bigger = self.scale * self._multiplier
        new_scale = tf.where(tf.math.is_finite(bigger), bigger, self.scale)
        return tf.group(self.scale.assign(new_scale),
                        self.good_steps.assign(0))
      return tf.cond(count >= self._increment_period, grow,
                     lambda: tf.group(self.good_steps.assign(count)))

    def shrink():
      smaller = tf.maximum(self.scale / self._multiplier, self._min_scale)
      return tf.group(self.scale.assign(smaller), self.good_steps.assign(0))

    return tf.cond(finite, grow_or_count, shrink, name='update_loss_scale')

  def apply_gradients(self, optimizer, grads_and_vars, global_step=None,
                      name='apply_scaled_gradients'):
    """Applies (already unscaled) gradients only when all are finite.

    Args:
      optimizer: a tf.compat.v1 optimizer.
      grads_and_vars: unscaled (gradient, variable) pairs.
      global_step: incremented only by applied steps.
      name: name of the returned op.

    Returns:
      An op: apply the update if the gradients are finite, then update
      the scale.
    """
    grads_and_vars = list(grads_and_vars)
    finite = all_finite([g for g, _ in grads_and_vars])
    used = self.scale.read_value()  # the step's scale, before update()
    # Slots are created outside the cond (apply_gradients does so in an
    # init scope), so skipping a step leaves the momentum untouched.
    apply_op = tf.cond(
        finite,
        lambda: tf.group(optimizer.apply_gradients(grads_and_vars,
                                                   global_step=global_step)),
        tf.no_op)
    with tf.control_dependencies([apply_op, used]):
      update_op = self.update(finite)
      at_min = tf.logical_and(tf.logical_not(finite), used <= self._min_scale)
      bad_steps = self.bad_steps.assign(
          tf.where(at_min, self.bad_steps + 1, tf.zeros_like(self.bad_steps)))
    self.diverged = tf.greater_equal(bad_steps, self._diverged_steps,
                                     name='loss_scale_diverged')
    return tf.group(apply_op, update_op, bad_steps, name=name)
