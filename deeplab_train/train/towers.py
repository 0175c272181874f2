"""Towers: one copy of the network per device, sharing its variables.

The batch is split into `num_clones` equal shares; tower i runs on its device
(`/gpu:i`, or the CPU with `clone_on_cpu`) and computes the loss of its
share. Variables are created by tower 0 only, on the variables device (the
CPU, or a replica_device_setter for distributed runs), and reused by the
others. Gradients are computed on each tower's device and averaged on the
CPU; the weight-decay gradient is added once, so two towers on halves of a
batch give the gradient of one tower on the whole batch.
"""
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow.compat.v1 as tf

from deeplab_train.model import layers
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config
from deeplab_train.train import losses as losses_lib

# Op types that hold variable state; these go to the variables device.
_VARIABLE_OP_TYPES = frozenset(
    ['Variable', 'VariableV2', 'VarHandleOp', 'AutoReloadVariable',
     'MutableHashTable', 'MutableHashTableV2', 'MutableHashTableOfTensors',
     'MutableHashTableOfTensorsV2', 'MutableDenseHashTable',
     'MutableDenseHashTableV2'])


def tower_devices(num_clones, clone_on_cpu=False, device_pattern=None):
  """The device of each tower.

  Args:
    num_clones: number of towers.
    clone_on_cpu: put every tower on '/cpu:0' (as the original).
    device_pattern: overrides both, e.g. '/cpu:%d' for towers on several
      CPU devices (`ConfigProto(device_count={'CPU': N})`).

  Returns:
    A list of `num_clones` device strings.
  """
  if device_pattern:
    return [device_pattern % i for i in range(num_clones)]
  if clone_on_cpu:
    return ['/cpu:0'] * num_clones
  return ['/gpu:%d' % i for i in range(num_clones)]


def device_chooser(compute_device, variables_device):
  """A device function: variables on `variables_device`, the rest on
  `compute_device`.

  Args:
    compute_device: device string for the computation.
    variables_device: device string, or a device function (e.g.
      `tf.train.replica_device_setter`) used for variable ops.

  Returns:
    fn(op) -> device string.
  """
  def choose(op):
    if op.type in _VARIABLE_OP_TYPES:
      if callable(variables_device):
        return variables_device(op)
      return variables_device
    return compute_device
  return choose


@dataclasses.dataclass
class Tower:
  """What one tower built.

  Attributes:
    index: tower number.
    device: its compute device.
    name_scope: its name scope ('tower_0/').
    data_loss: the tower's loss without weight decay.
    losses: named scalar losses of the tower (per scale).
    outputs: what `tower_fn` returned besides the losses.
    regularization_losses / weight_decays / update_ops: recorded by the
      layers (tower 0 creates the variables, so only its lists are
      complete); weight_decays are the (variable, factor) pairs of the
      regularization losses.
  """
  index: int
  device: str
  name_scope: str
  data_loss: tf.Tensor
  losses: Dict[str, tf.Tensor]
  outputs: Any
  regularization_losses: List[tf.Tensor]
  weight_decays: List[Tuple[Any, float]]
  update_ops: List[tf.Operation]


def runs_on_cpu(device):
  """Whether ops placed on `device` run on this process's CPU: a CPU
  device, or any device where TensorFlow sees no GPU (soft placement moves
  '/gpu:0' to the CPU). A cluster worker builds the graph for its own
  devices, so this process's view holds."""
  return (tf.DeviceSpec.from_string(device).device_type == 'CPU'
          or not session_config.gpus_visible())


def runs_on_onednn_cpu(device):
  """Whether ops placed on `device` run on this process's CPU with oneDNN's
  kernels (`runs_on_cpu`, and oneDNN on)."""
  return runs_on_cpu(device) and session_config.onednn_kernels_on()


def build_towers(tower_fn: Callable, devices, variables_device='/cpu:0',
                 onednn_forms=True, bf16_forms=False, xla_activations=False):
  """Builds one tower per device.

  Args:
    tower_fn: fn(index) -> (data_loss, {name: loss}, outputs); builds the
      network and loss of tower `index` in the current scopes.
    devices: list of compute devices, one per tower.
    variables_device: where variables live (string or device function).
    onednn_forms: towers whose device runs oneDNN's CPU kernels build the
      forms that are faster there (layers.dilated_depthwise_in_one_op,
      layers.filter_gradient_as_matmul,
      layers.batch_norm_from_input_moments), and where those kernels do
      not use AVX-512 the depthwise filter gradients in TensorFlow's own
      kernel (layers.depthwise_filter_gradient_in_tensorflow_kernel);
      towers on a CPU the banded dilated depthwise convolutions
      (layers.dilated_depthwise_in_bands);
      False: none does. Towers on a CPU score each image in ops of its own
      (losses_lib.per_image) either way, and every tower folds frozen BN
      (layers.folding_frozen_batch_norm) and projects ASPP's image pooling
      branch once per image (layers.broadcast_input_projected_once).
    bf16_forms: the graph is for grappler's bf16 rewrite: towers whose
      device runs oneDNN's CPU kernels compute the input gradients of
      strided depthwise convolutions at stride 1, where oneDNN's bfloat16
      kernels are fast (layers.strided_depthwise_input_gradient_at_stride_1),
      and where those kernels run on AMX tiles (cpu.onednn_amx) the dilated
      depthwise convolutions in one op too (layers.dilated_depthwise_in_one_op;
      a mobilenet_v2 OS8 bf16 step 2-4 % faster on a Xeon with AMX, the
      oneDNN forms slower together on an AVX512_BF16 EPYC: docs/speed.md)
      and those with bands of at most a quarter of the input in bands
      (layers.MAX_BF16_BAND: ASPP's rate 18 at crop 321).
      Towers whose device runs oneDNN's kernels with AVX-512 pad trained
      BN to a channel count its BN kernels take in blocks
      (layers.batch_norm_channels_padded): with onednn_forms, and with
      bf16_forms where those kernels use native bfloat16.
    xla_activations: towers whose device runs oneDNN's CPU kernels compile
      their activations with XLA (layers.activations_in_xla): for graphs
      built for grappler's bf16 rewrite, not compiled whole by XLA. With
      bf16_forms where oneDNN runs on AMX tiles, trained BN after a
      widening 1x1 convolution then takes its moments from the input's
      (layers.batch_norm_from_input_moments, centred), its offset in the
      activation's cluster: a mobilenet_v2 OS8 bf16 step 1.06x faster on a
      Xeon with AMX (docs/speed.md).

  Returns:
    A list of `Tower`.
  """
  features = cpu_lib.machine_cpu()
  amx = bf16_forms and cpu_lib.onednn_amx(features)
  avx512 = cpu_lib.onednn_avx512(features)
  # Float32 graphs on oneDNN's AVX-512 kernels, graphs for the bf16
  # rewrite on its native bfloat16 ones.
  pad_batch_norm = avx512 and (
      onednn_forms or (bf16_forms and cpu_lib.onednn_native_bf16(features)))
  towers = []
  for i, device in enumerate(devices):
    # The variable scope is entered before the name scope: re-entering the
    # root variable scope would otherwise reset the name scope to the root.
    with tf.variable_scope(tf.get_variable_scope(), reuse=True if i else None):
      with tf.name_scope('tower_%d' % i) as name_scope:
        with tf.device(device_chooser(device, variables_device)):
          onednn_cpu = runs_on_onednn_cpu(device)
          on_onednn = onednn_forms and onednn_cpu
          # bf16 graphs: the moments' product centred (rounded to bf16),
          # the offset and activation compiled by XLA.
          bf16_moments = amx and onednn_cpu and xla_activations
          with layers.recording() as rec, \
              losses_lib.per_image(runs_on_cpu(device)), \
              layers.folding_frozen_batch_norm(), \
              layers.broadcast_input_projected_once(), \
              layers.batch_norm_from_input_moments(
                  on_onednn or bf16_moments, centred=not on_onednn), \
              layers.dilated_depthwise_in_one_op(
                  on_onednn or (amx and onednn_cpu)), \
              layers.dilated_depthwise_in_bands(
                  (onednn_forms and runs_on_cpu(device))
                  or (amx and onednn_cpu),
                  layers.MAX_BAND if onednn_forms else layers.MAX_BF16_BAND), \
              layers.filter_gradient_as_matmul(on_onednn), \
              layers.depthwise_filter_gradient_in_tensorflow_kernel(
                  on_onednn and not avx512), \
              layers.strided_depthwise_input_gradient_at_stride_1(
                  bf16_forms and onednn_cpu), \
              layers.batch_norm_channels_padded(
                  pad_batch_norm and onednn_cpu), \
              layers.activations_in_xla(xla_activations and onednn_cpu):
            data_loss, losses, outputs = tower_fn(i)
    towers.append(Tower(i, device, name_scope, data_loss, losses, outputs,
                        list(rec.regularization_losses),
                        list(rec.weight_decays), list(rec.update_ops)))
  return towers


def averaged_gradients(towers: List[Tower], variables,
                       regularization_loss: Optional[tf.Tensor] = None,
                       average_device='/cpu:0'):
  """Mean over towers of d(data_loss)/dv, plus d(regularization)/dv once.

  Args:
    towers: the built towers.
    variables: the trainable variables.
    regularization_loss: scalar weight-decay loss (from tower 0), or None.
    average_device: where the averaging runs.

  Returns:
    A list of (gradient, variable) for variables with a gradient.
  """
  per_tower = []
  for tower in towers:
    with tf.name_scope(tower.name_scope), tf.device(tower.device):
      per_tower.append(tf.gradients(tower.data_loss, variables,
                                    colocate_gradients_with_ops=True))
  reg = [None] * len(variables)
  if regularization_loss is not None:
    with tf.name_scope(towers[0].name_scope), tf.device(towers[0].device):
      reg = tf.gradients(regularization_loss, variables,
                         colocate_gradients_with_ops=True)
  out = []
  with tf.name_scope('average_gradients'), tf.device(average_device):
    for k, var in enumerate(variables):
      grads = [g[k] for g in per_tower if g[k] is not None]
      terms = []
      if grads:
        if len(grads) != len(towers):
          raise ValueError('variable %s has a gradient in some towers only'
                           % var.op.name)
        mean = grads[0] if len(grads) == 1 else tf.add_n(grads) / len(grads)
        terms.append(mean)
      if reg[k] is not None:
        terms.append(reg[k])
      if terms:
        out.append((terms[0] if len(terms) == 1 else tf.add_n(terms), var))
  return out


def multiply_gradients(grads_and_vars, multipliers):
  """Scales each variable's gradient by `multipliers.get(var, 1)`."""
  out = []
  for grad, var in grads_and_vars:
    mult = multipliers.get(var)
    if mult is not None and grad is not None:
      if isinstance(grad, tf.IndexedSlices):
        grad = tf.IndexedSlices(grad.values * mult, grad.indices,
                                grad.dense_shape)
      else:
        grad = grad * mult
    out.append((grad, var))
  return out
