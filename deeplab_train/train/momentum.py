"""The momentum optimizer with the weight decay's gradient taken through
its accumulator (`MomentumWithDecayInAccumulator`)."""
import tensorflow.compat.v1 as tf


class MomentumWithDecayInAccumulator(tf.train.MomentumOptimizer):
  """tf.train.MomentumOptimizer for a loss with an L2 term
  factor * sum(w**2) / 2 per variable, given the gradients without it.

  Momentum on the whole gradient g + factor * w is

    accumulation = momentum * accumulation + g + factor * w
    w -= learning_rate * accumulation

  For each variable with a factor this first adds (factor / momentum) * w
  to the accumulation, in place (one ResourceApplyGradientDescent), then
  runs the momentum op on g alone: the same update, up to float32 rounding,
  with one pass over the weights (the in-place add) where the weight
  decay's gradient (a product) and its sum with g (an AddN) made three
  (docs/speed.md).

  Args:
    learning_rate, momentum: as for tf.train.MomentumOptimizer; momentum is
      a float > 0.
    decays: {variable: factor} (the factor times any gradient multiplier
      of the variable).
  """

  def __init__(self, learning_rate, momentum, decays, **kwargs):
    if not momentum > 0:
      raise ValueError('MomentumWithDecayInAccumulator needs momentum > 0, '
                       'not %r' % (momentum,))
    super().__init__(learning_rate, momentum, **kwargs)
    self._decay_factors = {var: float(factor)
                           for var, factor in decays.items()}
    self._momentum_value = float(momentum)

  def _after_decay(self, var):
    """Context whose ops run after (factor / momentum) * var is added to
    var's accumulation, where var has a factor."""
    factor = self._decay_factors.get(var)
    decayed = []
    if factor is not None:
      decayed.append(tf.raw_ops.ResourceApplyGradientDescent(
          var=self.get_slot(var, 'momentum').handle,
          alpha=tf.constant(-factor / self._momentum_value,
                            var.dtype.base_dtype),
          delta=var.read_value(), use_locking=self._use_locking))
    return tf.control_dependencies(decayed)

  def _resource_apply_dense(self, grad, var):
    with self._after_decay(var):
      return super()._resource_apply_dense(grad, var)

  def _resource_apply_sparse(self, grad, var, indices):
    with self._after_decay(var):
      return super()._resource_apply_sparse(grad, var, indices)
