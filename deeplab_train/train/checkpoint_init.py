"""Initialising a new run's variables from a checkpoint, explaining itself.

`make_init_plan` compares the model's variables with a checkpoint before
the session starts and sorts each variable into one of:

- restored: same name and shape in the checkpoint;
- excluded: under a last-layer scope while `initialize_last_layer` is off;
- missing: not in the checkpoint (kept at its initial value, as the
  original's `ignore_missing_vars=True`);
- mismatched: same name, other shape. Under a last-layer scope this is the
  usual "another class count" case: skipped with a hint. Elsewhere the
  checkpoint belongs to another network: an error.

A variable stored as another float type (float64, float16) is restored
cast to the model's, as the original's restore does. The optimizer's
variables (momentum slots) that the checkpoint holds are restored too, as
the original restores every variable but the step and the last layers it
excludes; those it lacks start from zero.

The plan's `init_fn` is meant for `tf.train.Scaffold(init_fn=...)`, which
runs it only when no checkpoint of the train logdir was restored.
"""
import dataclasses
from typing import Any, List, Optional, Tuple

from absl import logging
import tensorflow.compat.v1 as tf

from deeplab_train import restore as restore_lib
from deeplab_train.config import ConfigError
from deeplab_train.config import errors
from deeplab_train.runtime import checkpoint_state
from deeplab_train.train import scopes

# How many variable names a log line or error message lists.
_SHOW = 5


def resolve_checkpoint(path):
  """The initial checkpoint's prefix from a prefix or a directory.

  Args:
    path: 'dir/model.ckpt-1000', one of its files, or a directory (its
      latest checkpoint).

  Returns:
    The checkpoint prefix.

  Raises:
    ConfigError: nothing readable there.
  """
  return checkpoint_state.resolve(
      path, '{TrainOptions.tf_initial_checkpoint}',
      'pass a folder that holds the checkpoint to start from, or the '
      'checkpoint\'s prefix (DIR/model.ckpt-N, the name its .index file '
      'starts with)')


@dataclasses.dataclass
class InitPlan:
  """What `init_fn` restores from `checkpoint` and what it leaves alone."""
  checkpoint: str
  restored: List[str]
  excluded: List[str]
  missing: List[str]
  mismatched: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]]
  hints: List[errors.Message]
  saver: Optional[tf.train.Saver] = None
  unused: int = 0  # checkpoint variables the model does not have
  # The optimizer's variables restored (beside `restored`), and those the
  # checkpoint holds in the excluded last layers or with another shape.
  optimizer_restored: List[str] = dataclasses.field(default_factory=list)
  optimizer_excluded: List[str] = dataclasses.field(default_factory=list)
  optimizer_skipped: List[str] = dataclasses.field(default_factory=list)
  # (name, checkpoint dtype, model dtype) of the variables restored cast,
  # and the op that does it with the placeholder of the files' prefix.
  cast: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
  cast_restore: Optional[Tuple[Any, Any]] = None

  def init_fn(self, unused_scaffold, session):
    """Restores the planned variables (Scaffold's init_fn signature)."""
    if self.saver is not None:
      restore_lib.restore(self.saver, session, self.checkpoint)
    if self.cast_restore is not None:
      restore_lib.run_restore(session, *self.cast_restore, self.checkpoint)
    logging.info('Initialised %d variables from %s', len(self.restored)
                 + len(self.optimizer_restored), self.checkpoint)

  def summary_lines(self):
    """Human-readable lines: counts, examples, hints. The hints are
    errors.Message: they name options as fields, which a command's log
    shows as its flags (cli/app.flag_terms_in_logs); str() shows them
    bare."""
    lines = ['Initial checkpoint %s: %d variables to restore, %d excluded '
             '(last layers), %d skipped missing from the checkpoint, %d '
             'skipped with a shape mismatch (%d checkpoint variables unused)'
             % (self.checkpoint, len(self.restored), len(self.excluded),
                len(self.missing), len(self.mismatched), self.unused)]
    if (self.optimizer_restored or self.optimizer_excluded or
        self.optimizer_skipped):
      lines.append('  and %d of the optimizer\'s variables%s%s%s' % (
          len(self.optimizer_restored),
          ' (e.g. %s)' % _examples(self.optimizer_restored)
          if self.optimizer_restored else '',
          ', %d excluded with the last layers' % len(self.optimizer_excluded)
          if self.optimizer_excluded else '',
          ', %d skipped with another shape or type'
          % len(self.optimizer_skipped) if self.optimizer_skipped else ''))
    if self.cast:
      lines.append('  cast to the model\'s type: %s' % _examples(
          ['%s (%s to %s)' % entry for entry in self.cast]))
    if self.excluded:
      lines.append('  excluded: %s' % _examples(self.excluded))
    if self.missing:
      lines.append('  missing: %s' % _examples(self.missing))
    for name, ckpt_shape, model_shape in self.mismatched[:_SHOW]:
      lines.append('  shape mismatch: %s is %s in the checkpoint, %s in the '
                   'model' % (name, list(ckpt_shape), list(model_shape)))
    lines.extend(errors.Message('  hint: ' + h.template, *h.values)
                 for h in self.hints)
    return lines


def _examples(names):
  more = len(names) - _SHOW
  return ', '.join(names[:_SHOW]) + (' and %d more' % more if more > 0 else '')


def _mismatch_hint(mismatched, logits_scopes):
  """The class-count hint when the logits' last dimension differs."""
  for name, ckpt_shape, model_shape in mismatched:
    if (scopes.in_scopes(name, logits_scopes) and ckpt_shape and model_shape
        and ckpt_shape[:-1] == model_shape[:-1]):
      only_logits = all(scopes.in_scopes(n, logits_scopes)
                        for n, _, _ in mismatched)
      return errors.Message(
          'logits have %d classes in the checkpoint, the model %d: pass '
          '{TrainOptions.initialize_last_layer}=false'
          + (' {TrainOptions.last_layers_contain_logits_only}=true'
             if only_logits else '') + ' to start them afresh',
          ckpt_shape[-1], model_shape[-1])
  return errors.Message(
      'last-layer shapes differ from the checkpoint: pass '
      '{TrainOptions.initialize_last_layer}=false to start them afresh')


def _restorable_type(ckpt_dtype, var):
  """Whether a value stored as `ckpt_dtype` restores into `var`: as it is,
  or cast from one float type to another."""
  dtype = var.dtype.base_dtype
  return ckpt_dtype == dtype or (ckpt_dtype.is_floating and dtype.is_floating)


def _cast_restore(variables, ckpt_dtypes):
  """(op, prefix placeholder): restores `variables` ({name: variable}) from
  the checkpoint the placeholder names, each cast from its stored type."""
  names = sorted(variables)
  with tf.device('/cpu:0'):
    prefix = tf.placeholder(tf.string, [], name='cast_prefix')
    values = tf.raw_ops.RestoreV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[''] * len(names),
        dtypes=[ckpt_dtypes[n] for n in names], name='cast_restore')
  return tf.group(*[
      variables[n].assign(tf.cast(value, variables[n].dtype.base_dtype))
      for n, value in zip(names, values)], name='cast_assign'), prefix


def make_init_plan(checkpoint, variables, exclude_scopes=(),
                   last_layer_scopes=(), logits_scopes=('logits',),
                   allow_partial=False, optimizer_variables=()):
  """Plans the restore of `variables` from `checkpoint`.

  Call inside the training graph (it builds a Saver for the restore).

  Args:
    checkpoint: a checkpoint prefix (see `resolve_checkpoint`).
    variables: the model variables (not the optimizer's, not global_step).
    exclude_scopes: scopes not to restore (the last layers when
      initialize_last_layer is off).
    last_layer_scopes: scopes where a shape mismatch is skipped with a hint
      rather than an error.
    logits_scopes: scopes of the logits (for the class-count hint).
    allow_partial: accept a checkpoint lacking most of the variables not
      excluded (refused otherwise: usually another network's).
    optimizer_variables: the optimizer's variables (momentum slots), each
      restored where the checkpoint holds it with its shape, outside
      `exclude_scopes`.

  Returns:
    An InitPlan.

  Raises:
    ConfigError: the checkpoint cannot be read (DamagedCheckpointError: its
      files are damaged or incomplete), a variable outside the last layers
      has another shape, or a type that does not cast to the model's, no
      variable at all can be restored, or (without allow_partial) most of
      them are missing.
  """
  try:
    reader = restore_lib.checkpoint_reader(checkpoint)
  except ConfigError:
    raise  # a damaged or deleted checkpoint, named
  except (tf.errors.OpError, ValueError) as e:
    raise ConfigError('cannot read checkpoint %s: %s'
                      % (checkpoint, str(e).splitlines()[0])) from None
  restore_lib.check_complete(checkpoint)
  ckpt_shapes = {name: tuple(shape) for name, shape in
                 reader.get_variable_to_shape_map().items()}
  ckpt_dtypes = reader.get_variable_to_dtype_map()
  restored, excluded, missing, mismatched, fatal = {}, [], [], [], []
  for var in variables:
    name = scopes.variable_name(var)
    shape = tuple(var.shape.as_list())
    if scopes.in_scopes(name, exclude_scopes):
      excluded.append(name)
    elif name not in ckpt_shapes:
      missing.append(name)
    elif ckpt_shapes[name] != shape:
      entry = (name, ckpt_shapes[name], shape)
      (mismatched if scopes.in_scopes(name, last_layer_scopes)
       else fatal).append(entry)
    elif not _restorable_type(ckpt_dtypes[name], var):
      raise ConfigError(
          'checkpoint %s does not fit the model: %s is %s in the checkpoint, '
          '%s in the model; check {TrainOptions.tf_initial_checkpoint}',
          checkpoint, name, ckpt_dtypes[name].name,
          var.dtype.base_dtype.name)
    else:
      restored[name] = var
  if fatal:
    raise ConfigError(
        'checkpoint %s does not fit the model: %d variables have another '
        'shape (%s). Is it a checkpoint of this {ModelOptions.model_variant} '
        'with the same model flags (e.g. {ModelOptions.depth_multiplier})?'
        % (checkpoint, len(fatal), '; '.join(
            '%s is %s in the checkpoint, %s in the model'
            % (n, list(c), list(m)) for n, c, m in fatal[:3])))
  if not restored:
    raise ConfigError(
        'checkpoint %s holds none of the model\'s %d variables (it has e.g. '
        '%s; the model e.g. %s): check {TrainOptions.tf_initial_checkpoint} '
        'and {ModelOptions.model_variant}' % (checkpoint, len(variables),
                             _examples(sorted(ckpt_shapes)[:2]),
                             _examples([scopes.variable_name(v)
                                        for v in variables][:2])))
  wanted = len(variables) - len(excluded)
  if not allow_partial and 2 * len(missing) > wanted:
    raise ConfigError(
        'checkpoint %s lacks %d of the %d model variables to restore (e.g. '
        '%s; it has e.g. %s): is it a checkpoint of another network? Check '
        '{TrainOptions.tf_initial_checkpoint} and '
        '{ModelOptions.model_variant}, or pass '
        '{TrainOptions.allow_partial_initial_checkpoint}=true to start the '
        'missing ones from random values'
        % (checkpoint, len(missing), wanted, _examples(missing),
           _examples(sorted(n for n in ckpt_shapes
                            if n != 'global_step')[:2])))
  hints = [_mismatch_hint(mismatched, logits_scopes)] if mismatched else []
  optimizer, optimizer_excluded, optimizer_skipped = {}, [], []
  for var in optimizer_variables:
    name = scopes.variable_name(var)
    if name not in ckpt_shapes:
      continue
    if scopes.in_scopes(name, exclude_scopes):
      optimizer_excluded.append(name)
    elif (ckpt_shapes[name] == tuple(var.shape.as_list())
          and _restorable_type(ckpt_dtypes[name], var)):
      optimizer[name] = var
    else:
      optimizer_skipped.append(name)
  every = dict(restored, **optimizer)
  cast = {n: v for n, v in every.items()
          if ckpt_dtypes[n] != v.dtype.base_dtype}
  same = {n: v for n, v in every.items() if n not in cast}
  with tf.name_scope('initialization'):
    saver = (tf.train.Saver(var_list=same, name='init_saver') if same
             else None)
    cast_restore = _cast_restore(cast, ckpt_dtypes) if cast else None
  model_names = {scopes.variable_name(v)
                 for v in list(variables) + list(optimizer_variables)}
  unused = [n for n in sorted(ckpt_shapes)
            if n not in model_names and n != 'global_step']
  ranges = [n for n in unused
            if n.endswith(restore_lib.QUANTISATION_RANGE_SUFFIXES)]
  if ranges:
    hints.append(errors.Message(
        'the checkpoint holds %d quantisation ranges (e.g. %s) of '
        'quantisation-aware training: deeplab-train trains the float network '
        'from its weights and leaves the ranges out; deeplab-export '
        '--tflite_quantize=int8 quantises an exported model',
        len(ranges), _examples(ranges[:2])))
  return InitPlan(
      checkpoint, sorted(restored), sorted(excluded), sorted(missing),
      sorted(mismatched), hints, saver, len(unused), sorted(optimizer),
      sorted(optimizer_excluded), sorted(optimizer_skipped),
      [(n, ckpt_dtypes[n].name, v.dtype.base_dtype.name)
       for n, v in sorted(cast.items())], cast_restore)
