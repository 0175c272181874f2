"""`build_training_graph`: the whole training graph in one function.

Name scopes: 'input' (the batch, split per tower), 'tower_i' (network, loss
and gradients of tower i), 'average_gradients', 'train' (learning rate,
optimizer, train op, finiteness check), 'initialization' (restore from
--tf_initial_checkpoint); summaries sit at the top so their TensorBoard tags
are plain ('total_loss', 'learning_rate', 'losses/...', variable names).
"""
import contextlib
import dataclasses
from typing import Any, List, Optional

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train.model import nas_cell
from deeplab_train.model import registry
from deeplab_train.train import checkpoint_init
from deeplab_train.train import learning_rate as lr_lib
from deeplab_train.train import loss_scale
from deeplab_train.train import losses
from deeplab_train.train import momentum as momentum_lib
from deeplab_train.train import scopes
from deeplab_train.train import towers as towers_lib



@dataclasses.dataclass(frozen=True)
class TrainingGraph:
  """Everything a training session needs, as `build_training_graph` made it.

  Attributes:
    graph: the tf.Graph holding all of it.
    global_step: the step variable.
    step_after: the step after an update (fetch only with train_op).
    total_loss / data_loss: scalar losses (data_loss: the towers' mean
      cross-entropy; total_loss adds the weight decay).
    regularization_loss: the weight-decay loss, or None without any.
    learning_rate: the scheduled rate.
    train_op: one update (gradients, optimizer, tower 0's BN updates).
    all_finite: the loss and the updated weights are finite, and with fp16
      the loss scale did not find the model diverged (fetch only with
      train_op).
    summary_op: merged training summaries.
    saver: saves everything needed to resume exactly.
    scaffold: the session scaffold (saver, summary op, init_fn).
    init_plan: the restore from the initial checkpoint, or None.
    towers: the built `towers.Tower`s.
    model_variables / trainable_variables: what the network created.
    grads_and_vars: the total loss's averaged gradients after the
      multipliers. With momentum, the optimizer applies the data loss's
      and takes the weight decay through its accumulation
      (train/momentum.py); these are then built to be fetched only.
    last_layer_scopes: scopes of the last layers.
    batch_size: images per step (all towers).
    optimizer: the optimizer (possibly wrapped for a cluster).
    loss_scale: the fp16 DynamicLossScale, else None.
  """
  graph: tf.Graph
  global_step: Any
  step_after: tf.Tensor
  total_loss: tf.Tensor
  data_loss: tf.Tensor
  regularization_loss: Optional[tf.Tensor]
  learning_rate: tf.Tensor
  train_op: tf.Operation
  all_finite: tf.Tensor
  summary_op: tf.Tensor
  saver: tf.train.Saver
  scaffold: tf.train.Scaffold
  init_plan: Optional[Any]
  towers: List[Any]
  model_variables: List[Any]
  trainable_variables: List[Any]
  grads_and_vars: List[Any]
  last_layer_scopes: List[str]
  batch_size: int
  optimizer: Any
  loss_scale: Optional[Any]


@dataclasses.dataclass(frozen=True)
class _Losses:
  total_loss: tf.Tensor
  data_loss: tf.Tensor
  regularization_loss: Optional[tf.Tensor]


@dataclasses.dataclass(frozen=True)
class _Update:
  grads_and_vars: List[Any]
  optimizer: Any
  loss_scale: Optional[Any]
  train_op: tf.Operation
  step_after: tf.Tensor
  all_finite: tf.Tensor


def effective_weight_decay(train_options, model_variant):
  """TrainOptions.weight_decay, or the backbone registry entry's default."""
  if train_options.weight_decay is not None:
    return train_options.weight_decay
  return registry.get(model_variant).default_weight_decay


def deeplab_model_fn(model_options, train_options):
  """model_fn building DeepLab in training mode.

  Returns:
    fn(images) -> {'merged_logits': T, ...} (the 'semantic' output).
  """
  from deeplab_train.model import deeplab  # pylint: disable=g-import-not-at-top
  weight_decay = effective_weight_decay(train_options,
                                        model_options.model_variant)
  logging.info('Weight decay %g', weight_decay)

  def model_fn(images):
    outputs = deeplab.multi_scale_logits(
        images, model_options, image_pyramid=train_options.image_pyramid,
        weight_decay=weight_decay, is_training=True,
        fine_tune_batch_norm=train_options.fine_tune_batch_norm,
        drop_path=_drop_path(train_options))
    return outputs['semantic']
  return model_fn


def _drop_path(train_options):
  """The NAS cells' drop path (a nas_cell.DropPath scheduled over
  training_number_of_steps on the global step), or None without one."""
  if train_options.drop_path_keep_prob == 1.0:
    return None
  return nas_cell.DropPath(
      keep_prob=train_options.drop_path_keep_prob,
      total_steps=train_options.training_number_of_steps,
      global_step=tf.train.get_or_create_global_step())


def default_last_layer_scopes(train_options):
  from deeplab_train.model import deeplab  # pylint: disable=g-import-not-at-top
  return list(deeplab.get_extra_layer_scopes(
      train_options.last_layers_contain_logits_only))


def _split_batch(samples, num_clones, batch_size):
  """{'image': [B..], 'label': [B..]} -> one such dict per tower."""
  for key in ('image', 'label'):
    if key not in samples:
      raise ValueError('input_fn must return a dict with %r, got keys %s'
                       % (key, sorted(samples)))
    static = samples[key].shape[0]
    if static is not None and static != batch_size:
      raise ValueError('input_fn gave a batch of %s %ss, expected '
                       'train_batch_size=%d' % (static, key, batch_size))
  if num_clones == 1:
    return [{'image': samples['image'], 'label': samples['label']}]
  images = tf.split(samples['image'], num_clones, axis=0)
  labels = tf.split(samples['label'], num_clones, axis=0)
  return [{'image': i, 'label': l} for i, l in zip(images, labels)]


def _image_summaries(tower, num_classes):
  """The original's sample images: input, label and prediction."""
  out = tower.outputs
  scale = max(1, 255 // num_classes)
  label = tf.cast(tf.minimum(out['label'] * scale, 255), tf.uint8)
  pred = tf.expand_dims(tf.argmax(out['logits'], 3), -1)
  pred = tf.cast(tf.minimum(pred * scale, 255), tf.uint8)
  return [tf.summary.image('samples/image', out['image']),
          tf.summary.image('samples/label', label),
          tf.summary.image('samples/semantic', pred)]


def build_training_graph(model_options, train_options, *, ignore_label,
                         input_fn, model_fn=None, last_layer_scopes=None,
                         init_checkpoint=None, keep_checkpoint_max=5,
                         device_pattern=None, variables_device='/cpu:0',
                         input_device='/cpu:0', graph_device=None,
                         wrap_optimizer=None):
  """Builds the training graph.

  Args:
    model_options: ModelOptions (num_classes, crop size, backbone, ...).
    train_options: TrainOptions.
    ignore_label: label value without loss.
    input_fn: fn() -> {'image': float32 [B,H,W,3], 'label': int32
      [B,H,W,1], ...} with B = train_batch_size; called in the graph.
    model_fn: fn(images) -> {'merged_logits': T, ...}; default: DeepLab from
      the options. Called once per tower inside `layers.recording()`.
    last_layer_scopes: scopes of the last layers (gradient multiplier,
      initialize_last_layer); default: the model's extra layer scopes.
    init_checkpoint: checkpoint prefix to initialise from, or None.
    keep_checkpoint_max: checkpoints kept by the saver.
    device_pattern: tower devices, e.g. '/cpu:%d' (see towers.tower_devices).
    variables_device: device (or device function) of the variables.
    input_device: device of the input pipeline.
    graph_device: device function around the whole graph, or None. Cluster
      workers pass a `replica_device_setter`: variables go to the ps tasks,
      every other op to the worker (merged with the devices above, which
      then name devices of that worker).
    wrap_optimizer: fn(optimizer) -> optimizer applied to the momentum
      optimizer (e.g. SyncReplicasOptimizer), or None.

  Returns:
    A TrainingGraph.

  Raises:
    ConfigError: the initial checkpoint does not fit the model.
  """
  if model_fn is None:
    model_fn = deeplab_model_fn(model_options, train_options)
  if last_layer_scopes is None:
    last_layer_scopes = default_last_layer_scopes(train_options)
  graph = tf.Graph()
  with graph.as_default(), _device_scope(graph_device):
    if train_options.seed is not None:
      tf.set_random_seed(train_options.seed)
    with tf.device(variables_device):
      global_step = tf.train.get_or_create_global_step()
    with tf.name_scope('input'), tf.device(input_device):
      shares = _split_batch(input_fn(), train_options.num_clones,
                            train_options.train_batch_size)
    tower_fn = _tower_fn(shares, model_fn, model_options.num_classes,
                         ignore_label, train_options, global_step)
    before = set(tf.global_variables())
    # The oneDNN forms are for fp32: under grappler's bf16 rewrite the
    # dilated depthwise op ran on TensorFlow's own kernel, which refuses
    # dilations (AVX2 CPU); with native bf16 (AVX512_BF16) it ran, but the
    # forms made the bf16 step slower (docs/speed.md). The bf16 rewrite
    # has forms of its own (the dilated op among them where oneDNN runs
    # on AMX tiles).
    towers = towers_lib.build_towers(
        tower_fn, towers_lib.tower_devices(
            train_options.num_clones, train_options.clone_on_cpu,
            device_pattern), variables_device,
        onednn_forms=train_options.mixed_precision == 'none',
        bf16_forms=train_options.mixed_precision == 'bf16',
        xla_activations=(train_options.mixed_precision == 'bf16'
                         and not train_options.use_xla))
    model_variables = [v for v in tf.global_variables() if v not in before]
    trainable = [v for v in tf.trainable_variables() if v not in before]
    with tf.name_scope('train') as train_scope:
      losses_ = _losses(towers)
      rate = lr_lib.learning_rate(global_step, train_options)
    update = _update(towers, losses_, rate, global_step, trainable,
                     model_variables, last_layer_scopes, train_options,
                     train_scope, input_device, wrap_optimizer)
    summary_op = _summary_op(losses_, rate, towers[0], model_variables,
                             train_options.save_summaries_images,
                             model_options.num_classes)
    # Everything needed to resume exactly: global step, momentum slots,
    # batch-norm moving statistics.
    saver = tf.train.Saver(max_to_keep=keep_checkpoint_max,
                           save_relative_paths=True)
    # The optimizer's variables: those the update added (momentum slots).
    made = before | set(model_variables)
    init_plan = _init_plan(init_checkpoint, model_variables, train_options,
                           last_layer_scopes, [
                               v for v in tf.global_variables()
                               if v not in made])
    scaffold = tf.train.Scaffold(
        init_fn=init_plan.init_fn if init_plan else None,
        saver=saver, summary_op=summary_op)
  return TrainingGraph(
      graph=graph, global_step=global_step, step_after=update.step_after,
      total_loss=losses_.total_loss, data_loss=losses_.data_loss,
      regularization_loss=losses_.regularization_loss, learning_rate=rate,
      train_op=update.train_op, all_finite=update.all_finite,
      summary_op=summary_op, saver=saver, scaffold=scaffold,
      init_plan=init_plan, towers=towers, model_variables=model_variables,
      trainable_variables=trainable, grads_and_vars=update.grads_and_vars,
      last_layer_scopes=last_layer_scopes,
      batch_size=train_options.train_batch_size, optimizer=update.optimizer,
      loss_scale=update.loss_scale)


def _device_scope(device):
  """tf.device(device), or no scope for None (the default graph must be
  entered first: tf.device refuses device functions in eager mode)."""
  return tf.device(device) if device is not None else contextlib.nullcontext()


def _xla_scope(use_xla):
  """XLA compilation of the network and its gradients (--use_xla), or none.

  Only the network is marked for compilation: session-wide auto-clustering
  would also take the input pipeline's functions and the loss's hard-pixel
  mining, whose shapes are only known at run time, and fail on them.
  """
  if not use_xla:
    return contextlib.nullcontext()
  return tf.xla.experimental.jit_scope(compile_ops=True)


def _tower_fn(shares, model_fn, num_classes, ignore_label, train_options,
              global_step):
  """fn(i) building tower i's network and loss on its share of the batch."""
  loss_kwargs = dict(
      label_weights=train_options.label_weights,
      upsample_logits=train_options.upsample_logits,
      top_k_percent_pixels=train_options.top_k_percent_pixels,
      hard_example_mining_step=train_options.hard_example_mining_step,
      global_step=global_step)

  def tower_fn(i):
    image = tf.identity(shares[i]['image'], name='image')
    label = tf.identity(shares[i]['label'], name='label')
    with _xla_scope(train_options.use_xla):
      scales_to_logits = model_fn(image)
    data_loss, per_scale = losses.scales_loss(
        scales_to_logits, label, num_classes, ignore_label, **loss_kwargs)
    merged = tf.identity(scales_to_logits['merged_logits'], name='semantic')
    return data_loss, per_scale, {'image': image, 'label': label,
                                  'logits': merged}
  return tower_fn


def _losses(towers):
  """The towers' mean data loss, tower 0's weight decay, their sum."""
  reg_losses = towers[0].regularization_losses
  regularization = (tf.add_n(reg_losses, name='regularization_loss')
                    if reg_losses else None)
  data_loss = tf.add_n([t.data_loss for t in towers]) / float(len(towers))
  data_loss = tf.identity(data_loss, name='data_loss')
  total = data_loss
  if regularization is not None:
    total += regularization
  return _Losses(total_loss=tf.identity(total, name='total_loss'),
                 data_loss=data_loss, regularization_loss=regularization)


def _update(towers, losses_, learning_rate, global_step, trainable,
            model_variables, last_layer_scopes, train_options, train_scope,
            cpu, wrap_optimizer=None):
  """Averaged and multiplied gradients, the optimizer's update, tower 0's
  batch-norm updates, and the checks fetched with them."""
  scale = None
  if train_options.mixed_precision == 'fp16':
    if wrap_optimizer is not None:
      # A cluster task's run is refused before (run._check_cluster_run).
      raise ValueError('fp16 loss scaling cannot skip a step of replicas')
    with tf.name_scope(train_scope), tf.device(cpu):
      scale = loss_scale.DynamicLossScale()
  towers_for_grads, reg_loss = _scaled_losses(
      towers, losses_.regularization_loss, scale)
  # With momentum (and no loss scale or cluster wrapper), the weight decay
  # goes through the optimizer's accumulation instead of the gradients.
  decays = (_weight_decays(towers[0], trainable)
            if (scale is None and wrap_optimizer is None
                and train_options.optimizer == 'momentum'
                and train_options.momentum > 0) else {})
  grads_and_vars = towers_lib.averaged_gradients(
      towers_for_grads, trainable, None if decays else reg_loss,
      average_device=cpu)
  with tf.name_scope(train_scope), tf.device(cpu):
    if scale is not None:
      grads_and_vars = scale.unscale(grads_and_vars)
    multipliers = scopes.gradient_multipliers(
        trainable, last_layer_scopes,
        train_options.last_layer_gradient_multiplier)
    grads_and_vars = towers_lib.multiply_gradients(grads_and_vars,
                                                   multipliers)
    applied = grads_and_vars
    if decays:
      factors = {var: factor * multipliers.get(var, 1.0)
                 for var, factor in decays.items()}
      applied = _with_zero_gradients(grads_and_vars, factors, trainable)
      optimizer = momentum_lib.MomentumWithDecayInAccumulator(
          learning_rate, train_options.momentum, factors)
      grads_and_vars = _loss_gradients(applied, factors)
    else:
      optimizer = _optimizer(train_options, learning_rate)
    if wrap_optimizer is not None:
      optimizer = wrap_optimizer(optimizer)
    if scale is None:
      # The loss fetched with a step is that of the weights before its
      # update: with the decay in the accumulator, nothing else orders the
      # weight-decay loss's reads before the update.
      with tf.control_dependencies([losses_.total_loss]):
        apply_op = optimizer.apply_gradients(applied,
                                             global_step=global_step)
    else:
      # A step with non-finite gradients is skipped and the scale halved.
      apply_op = scale.apply_gradients(optimizer, grads_and_vars,
                                       global_step=global_step)
    # BN moving averages are updated from tower 0's batch, as the original.
    train_op = tf.group(apply_op, *towers[0].update_ops, name='train_op')
    with tf.control_dependencies([train_op]):
      step_after = tf.identity(global_step.read_value(), name='step_after')
      checks = [tf.math.is_finite(losses_.total_loss),
                _weights_are_finite(model_variables)]
      if scale is not None:
        checks.append(tf.logical_not(scale.diverged))
      all_finite = tf.reduce_all(tf.stack(checks), name='all_finite')
  return _Update(grads_and_vars=grads_and_vars, optimizer=optimizer,
                 loss_scale=scale, train_op=train_op, step_after=step_after,
                 all_finite=all_finite)


def _weight_decays(tower0, trainable):
  """{variable: L2 factor} of the trainable variables with weight decay."""
  chosen = set(trainable)
  return {var: factor for var, factor in tower0.weight_decays
          if var in chosen}


def _with_zero_gradients(grads_and_vars, factors, trainable):
  """grads_and_vars, plus a zero gradient for each variable with a weight
  decay factor and no gradient of the data loss (its update is then the
  weight decay's alone, as with the decay's gradient)."""
  have = {var for _, var in grads_and_vars}
  return list(grads_and_vars) + [(tf.zeros_like(var), var)
                                 for var in trainable
                                 if var in factors and var not in have]


def _loss_gradients(grads_and_vars, factors):
  """The total loss's gradients, g + factor * w, from the data loss's
  (built to be fetched, e.g. by tests; training applies the data loss's
  with the factors through MomentumWithDecayInAccumulator)."""
  with tf.name_scope('loss_gradients'):
    return [(tf.convert_to_tensor(grad) + factors[var] * var
             if var in factors else grad, var)
            for grad, var in grads_and_vars]


def _weights_are_finite(variables):
  """bool tensor: every value of `variables` is finite."""
  return tf.reduce_all(tf.stack(
      [tf.reduce_all(tf.math.is_finite(v)) for v in variables]))


def _optimizer(train_options, learning_rate):
  """The original's optimizers: momentum on the schedule, or Adam at the
  constant --adam_learning_rate (the original ignores the schedule there)."""
  if train_options.optimizer == 'adam':
    return tf.train.AdamOptimizer(train_options.adam_learning_rate,
                                  epsilon=train_options.adam_epsilon)
  return tf.train.MomentumOptimizer(learning_rate, train_options.momentum)


def _scaled_losses(towers, regularization_loss, scale):
  """Towers and weight-decay loss to differentiate: as they are, or each
  multiplied by the fp16 loss scale (on its tower's device)."""
  if scale is None:
    return towers, regularization_loss
  scaled = []
  for tower in towers:
    with tf.name_scope(tower.name_scope), tf.device(tower.device):
      scaled.append(dataclasses.replace(
          tower, data_loss=scale.scale_loss(tower.data_loss)))
  if regularization_loss is not None:
    with tf.device(towers[0].device):
      regularization_loss = scale.scale_loss(regularization_loss)
  return scaled, regularization_loss


def _summary_op(losses_, learning_rate, tower0, model_variables,
                with_images, num_classes):
  """Losses, learning rate, variable histograms (and sample images)."""
  # No name scope here: it would prefix every TensorBoard tag.
  summaries = [tf.summary.scalar('losses/total_loss', losses_.total_loss),
               tf.summary.scalar('losses/data_loss', losses_.data_loss),
               tf.summary.scalar('learning_rate', learning_rate)]
  if losses_.regularization_loss is not None:
    summaries.append(tf.summary.scalar('losses/regularization_loss',
                                       losses_.regularization_loss))
  for scale, loss in sorted(tower0.losses.items()):
    summaries.append(tf.summary.scalar('losses/tower_0/%s' % scale, loss))
  # Under 'variables/': a tag equal to a variable's op name would get
  # uniquified to 'name_1'.
  summaries += [tf.summary.histogram('variables/' + v.op.name, v)
                for v in model_variables]
  if with_images:
    summaries += _image_summaries(tower0, num_classes)
  return tf.summary.merge(summaries)


def _init_plan(init_checkpoint, model_variables, train_options,
               last_layer_scopes, optimizer_variables):
  """The restore from --tf_initial_checkpoint (None without one), logged."""
  if not init_checkpoint:
    return None
  exclude = [] if train_options.initialize_last_layer else last_layer_scopes
  plan = checkpoint_init.make_init_plan(
      init_checkpoint, model_variables, exclude_scopes=exclude,
      last_layer_scopes=last_layer_scopes,
      allow_partial=train_options.allow_partial_initial_checkpoint,
      optimizer_variables=optimizer_variables)
  for line in plan.summary_lines():
    (logging.warning if plan.mismatched else logging.info)(line)
  return plan
