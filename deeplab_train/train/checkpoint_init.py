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

The plan's `init_fn` is meant for `tf.train.Scaffold(init_fn=...)`, which
runs it only when no checkpoint of the train logdir was restored.
"""
import dataclasses
from typing import List, Optional, Tuple

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

  def init_fn(self, unused_scaffold, session):
    """Restores the planned variables (Scaffold's init_fn signature)."""
    if self.saver is not None:
      restore_lib.restore(self.saver, session, self.checkpoint)
    logging.info('Initialised %d variables from %s', len(self.restored),
                 self.checkpoint)

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


def make_init_plan(checkpoint, variables, exclude_scopes=(),
                   last_layer_scopes=(), logits_scopes=('logits',),
                   allow_partial=False):
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

  Returns:
    An InitPlan.

  Raises:
    ConfigError: the checkpoint cannot be read, a variable outside the last
      layers has another shape, no variable at all can be restored, or
      (without allow_partial) most of them are missing.
  """
  try:
    ckpt_shapes = {name: tuple(shape)
                   for name, shape in tf.train.list_variables(checkpoint)}
  except (tf.errors.OpError, ValueError) as e:
    raise ConfigError('cannot read checkpoint %s: %s'
                      % (checkpoint, str(e).splitlines()[0])) from None
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
  with tf.name_scope('initialization'):
    saver = tf.train.Saver(var_list=restored, name='init_saver',
                           allow_empty=False)
  model_names = {scopes.variable_name(v) for v in variables}
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
  return InitPlan(checkpoint, sorted(restored), sorted(excluded),
                  sorted(missing), sorted(mismatched), hints, saver,
                  len(unused))
