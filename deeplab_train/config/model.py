"""The network's options (owned by model/): what defines the checkpoint's
variables. Mirrors the original's common.ModelOptions with the flag
defaults of the original common.py / train.py."""
import dataclasses
from typing import Optional, Tuple

from deeplab_train.config.errors import check
from deeplab_train.config.errors import check_finite
from deeplab_train.config.errors import ConfigError
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

OUTPUT_STRIDES = (4, 8, 16, 32)
MERGE_METHODS = ('max', 'avg')
# The keys of each kind of dense prediction cell operation.
CELL_OPERATION_KEYS = {'conv': ('op', 'input', 'kernel', 'rate'),
                       'pyramid_pooling': ('op', 'input', 'grid_size')}
# The cell's rates are for this output stride (scaled for smaller ones).
CELL_RATES_OUTPUT_STRIDE = 16


# The original's rule for logits kernels larger than 1: only its logits of
# one branch per atrous rate, built without the ASPP's batch norm.
LOGITS_KERNEL_RULE = (
    '{ModelOptions.logits_kernel_size}=%d needs {ModelOptions.atrous_rates} '
    'and {ModelOptions.aspp_with_batch_norm}=false (as in the original: the '
    'logits are then one branch per rate); otherwise it must be 1')


@dataclasses.dataclass(frozen=True)
class ModelOptions(JsonMixin):
  """What defines the network (and so the checkpoint's variables).

  Attributes:
    num_classes: classes of the 'semantic' output.
    model_variant: backbone name (see `deeplab_train.model.known_variants`).
    crop_size: (height, width) the network is built for, or None for
      dynamic shapes (image pooling then uses the tensor's own size).
    atrous_rates: rates of the atrous ASPP branches; None for none.
    output_stride: ratio of input to backbone output resolution (4/8/16/32).
    decoder_output_stride: strides of the decoder stages, e.g. (4,); None
      for no decoder.
    multi_grid: unit rates of the last backbone block (resnet variants).
    image_pooling_crop_size / image_pooling_stride: the original's options
      for image-level pooling at a size other than the crop.
    depth_multiplier: channel multiplier (mobilenet_v2).
    divisible_by: channel rounding for mobilenet_v2 (None: the net's default).
    merge_method: 'max' or 'avg' over the scales of an image pyramid.
    prediction_with_upsampled_logits: upsample logits before argmax.
    use_bounded_activation: relu6 in place of relu in ASPP/decoder.
    batch_norm_decay: decay of the BN moving averages in ASPP/decoder.
    aspp_with_concat_projection: project the concatenated ASPP branches
      with a 1x1 conv ('concat_projection'); false (MobileNetV3) keeps the
      concatenation.
    aspp_with_squeeze_and_excitation: the image pooling branch gates the
      ASPP output (squeeze-and-excitation) instead of being concatenated.
    image_se_uses_qsigmoid: that gate is a hard sigmoid,
      relu6(x + 3) * 0.16667 (the original's constant).
    decoder_use_sum_merge: the decoder adds its projected features to the
      upsampled ones instead of concatenating them.
    decoder_output_is_logits: the decoder's last layer gives the logits.
    nas_stem_output_num_conv_filters / nas_use_classification_head /
      nas_remove_os32_stride: the NAS backbones' architecture options.
    dense_prediction_cell_config: the dense prediction cell that replaces
      ASPP (the original's --dense_prediction_cell_json, held here itself,
      not as a path): a tuple of CellOperation, see
      `dense_prediction_cell_problem`; None for ASPP.
  """
  num_classes: int = 21
  model_variant: str = 'mobilenet_v2'
  crop_size: Optional[Tuple[int, int]] = None
  atrous_rates: Optional[Tuple[int, ...]] = None
  output_stride: int = 16
  decoder_output_stride: Optional[Tuple[int, ...]] = None
  decoder_use_separable_conv: bool = True
  aspp_with_batch_norm: bool = True
  aspp_with_separable_conv: bool = True
  add_image_level_feature: bool = True
  image_pooling_crop_size: Optional[Tuple[int, int]] = None
  image_pooling_stride: Tuple[int, int] = (1, 1)
  multi_grid: Optional[Tuple[int, ...]] = None
  depth_multiplier: float = 1.0
  divisible_by: Optional[int] = None
  logits_kernel_size: int = 1
  merge_method: str = 'max'
  prediction_with_upsampled_logits: bool = True
  use_bounded_activation: bool = False
  aspp_convs_filters: int = 256
  decoder_filters: int = 256
  batch_norm_decay: float = 0.9997
  aspp_with_concat_projection: bool = True
  aspp_with_squeeze_and_excitation: bool = False
  image_se_uses_qsigmoid: bool = False
  decoder_use_sum_merge: bool = False
  decoder_output_is_logits: bool = False
  nas_stem_output_num_conv_filters: int = 20
  nas_use_classification_head: bool = False
  nas_remove_os32_stride: bool = False
  dense_prediction_cell_config: Optional[Tuple['CellOperation', ...]] = None

  def __post_init__(self):
    # Normalise sequences (lists from JSON, strings from flags) to tuples so
    # the options stay hashable and compare equal after a JSON round trip.
    set_field(self, 'crop_size', tuple_or_none(self.crop_size))
    for name in ('atrous_rates', 'decoder_output_stride', 'multi_grid'):
      set_field(self, name, tuple_or_none(getattr(self, name)) or None)
    set_field(self, 'image_pooling_crop_size',
              tuple_or_none(self.image_pooling_crop_size))
    set_field(self, 'image_pooling_stride',
              tuple_or_none(self.image_pooling_stride))
    set_field(self, 'depth_multiplier', float(self.depth_multiplier))
    set_field(self, 'dense_prediction_cell_config',
              normalized_cell(self.dense_prediction_cell_config))

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check_finite(self)
    check(self.num_classes >= 1,
          'num_classes must be >= 1, got %d' % self.num_classes)
    stride = self.output_stride
    check(stride in OUTPUT_STRIDES, '{ModelOptions.output_stride} must be 4, '
          '8, 16 or 32, got %d' % stride)
    decoder = self.decoder_output_stride or ()
    for name, values in (('decoder_output_stride', decoder),
                         ('atrous_rates', self.atrous_rates or ()),
                         ('multi_grid', self.multi_grid or ()),
                         ('image_pooling_stride', self.image_pooling_stride),
                         ('image_pooling_crop_size',
                          self.image_pooling_crop_size or ())):
      check(all(v >= 1 for v in values),
            '{ModelOptions.%s} must be >= 1, got %s'
            % (name, ','.join(map(str, values))))
    for name in ('aspp_convs_filters', 'decoder_filters',
                 'nas_stem_output_num_conv_filters'):
      check(getattr(self, name) >= 1, '{ModelOptions.%s} must be >= 1, got '
            '%d' % (name, getattr(self, name)))
    check(self.divisible_by is None or self.divisible_by >= 1,
          '{ModelOptions.divisible_by} must be >= 1, got %s'
          % self.divisible_by)
    check(0 <= self.batch_norm_decay <= 1,
          '{ModelOptions.batch_norm_decay} must be in [0, 1], got %g (the '
          "moving statistics' weight of their old value)"
          % self.batch_norm_decay)
    check(all(s < stride and stride % s == 0 for s in decoder),
          '{ModelOptions.decoder_output_stride}=%s must divide and be smaller '
          'than {ModelOptions.output_stride}=%d'
          % (','.join(map(str, decoder)), stride))
    check(list(decoder) == sorted(decoder, reverse=True),
          '{ModelOptions.decoder_output_stride} must be in decreasing order, '
          'e.g. 8,4; got %s' % ','.join(map(str, decoder)))
    check(self.crop_size is None or len(self.crop_size) == 2,
          'crop size must be HEIGHT,WIDTH, got %s' % (self.crop_size,))
    self._check_pooling_fits()
    check(self.merge_method in MERGE_METHODS, "{ModelOptions.merge_method} "
          "must be 'max' or 'avg', got %r" % self.merge_method)
    check(self.depth_multiplier > 0,
          '{ModelOptions.depth_multiplier} must be > 0')
    check(self.logits_kernel_size >= 1,
          '{ModelOptions.logits_kernel_size} must be >= 1')
    check(self.logits_kernel_size == 1 or (
        self.atrous_rates and not self.aspp_with_batch_norm),
          LOGITS_KERNEL_RULE % self.logits_kernel_size)
    self._validate_mobilenet_v3_head()
    if self.dense_prediction_cell_config is not None:
      self._validate_cell()
    return self

  def _check_pooling_fits(self):
    """The image pooling's window (over the features of its crop) fits in
    the features of a fixed crop: TensorFlow's average pooling failed with
    'Negative dimension size' and a traceback."""
    pool, crop = self.image_pooling_crop_size, self.crop_size
    if (not pool or crop is None or len(pool) != 2
        or not self.add_image_level_feature
        or self.dense_prediction_cell_config is not None):
      return  # no image pooling branch (a cell pools on its own grid)
    features = lambda size: (size - 1) // self.output_stride + 1
    check(all(features(p) <= features(c) for p, c in zip(pool, crop)),
          '{ModelOptions.image_pooling_crop_size}=%s is larger than '
          '{ModelOptions.crop_size}=%s: the image pooling window must fit in '
          'the crop; give a crop at least that large, or a smaller '
          '{ModelOptions.image_pooling_crop_size}'
          % (','.join(map(str, pool)), ','.join(map(str, crop))))

  def _validate_mobilenet_v3_head(self):
    """The head options of MobileNetV3 fit the rest of the network."""
    for name in ('decoder_use_sum_merge', 'decoder_output_is_logits'):
      check(not getattr(self, name) or self.decoder_output_stride,
            '{ModelOptions.%s} needs a decoder: set '
            '{ModelOptions.decoder_output_stride} (e.g. 8)' % name)
    check(not self.decoder_output_is_logits
          or self.decoder_filters == self.num_classes,
          'with {ModelOptions.decoder_output_is_logits} the decoder gives the '
          'logits: {ModelOptions.decoder_filters}=%d must equal '
          '{ModelOptions.num_classes}=%d'
          % (self.decoder_filters, self.num_classes))
    if self.aspp_with_squeeze_and_excitation:
      check(self.add_image_level_feature,
            '{ModelOptions.aspp_with_squeeze_and_excitation} gates the ASPP '
            'with the image pooling branch: it needs '
            '{ModelOptions.add_image_level_feature}')
    check(not self.image_se_uses_qsigmoid
          or self.aspp_with_squeeze_and_excitation,
          '{ModelOptions.image_se_uses_qsigmoid} only changes the gate of '
          '{ModelOptions.aspp_with_squeeze_and_excitation}, which is off')
    for name, value in (('aspp_with_squeeze_and_excitation', True),
                        ('aspp_with_concat_projection', False)):
      check(getattr(self, name) != value or self.aspp_with_batch_norm,
            '{ModelOptions.%s}=%s changes the ASPP, which '
            '{ModelOptions.aspp_with_batch_norm}=false leaves out'
            % (name, str(value).lower()))
    # Without the projection the gate multiplies the concatenated branches:
    # only aspp0 has the gate's aspp_convs_filters channels.
    check(not (self.aspp_with_squeeze_and_excitation
               and not self.aspp_with_concat_projection
               and self.atrous_rates),
          '{ModelOptions.atrous_rates} must be empty when '
          '{ModelOptions.aspp_with_squeeze_and_excitation} is on and '
          '{ModelOptions.aspp_with_concat_projection} off: the gate has '
          '{ModelOptions.aspp_convs_filters} channels, the concatenated '
          'branches more')

  def _validate_cell(self):
    problem = dense_prediction_cell_problem(self.dense_prediction_cell_config)
    if problem:
      raise ConfigError('{ModelOptions.dense_prediction_cell_config} is not '
                        'a valid dense prediction cell: %s', problem)
    check(self.output_stride <= CELL_RATES_OUTPUT_STRIDE,
          '{ModelOptions.output_stride} must be 4, 8 or 16 with a dense '
          'prediction cell (its rates are scaled by 16 / output_stride), '
          'got %d' % self.output_stride)


class CellOperation(dict):
  """One operation of a dense prediction cell, e.g. {'op': 'conv',
  'kernel': 3, 'rate': (1, 6), 'input': -1}.

  A read-only, hashable dict (so ModelOptions stays hashable) that JSON
  writes as the object of the cell file.
  """

  def __hash__(self):
    return hash(tuple(sorted(self.items())))

  def __reduce__(self):
    return type(self), (dict(self),)

  def _read_only(self, *unused_args, **unused_kwargs):
    raise TypeError('a dense prediction cell operation is read-only')

  __setitem__ = __delitem__ = __ior__ = _read_only
  clear = pop = popitem = setdefault = update = _read_only


def normalized_cell(cell):
  """A cell as ModelOptions holds it: a tuple of CellOperation whose list
  values are tuples. None stays None; what is not a list of objects is
  left as it is for `dense_prediction_cell_problem` to report."""
  if not isinstance(cell, (list, tuple)):
    return cell
  return tuple(
      CellOperation((k, _frozen(v)) for k, v in op.items())
      if isinstance(op, dict) else op for op in cell)


def _frozen(value):
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def dense_prediction_cell_problem(cell):
  """What is wrong with a dense prediction cell description, or None.

  A cell is a non-empty list of operations. Operation i is an object with
  'input': -1 (the backbone features) or the index of an earlier operation,
  and 'op': either 'conv' with 'kernel' (an integer or [height, width];
  1 is a 1x1 conv, anything else a separable conv) and 'rate' (an integer
  or [height, width], the atrous rates at output stride 16; needed unless
  the kernel is 1x1), or 'pyramid_pooling' with 'grid_size' ([rows,
  columns] of the pooling grid).

  Args:
    cell: the description (lists or tuples, dicts).

  Returns:
    A message naming the bad operation, or None for a valid cell.
  """
  if not isinstance(cell, (list, tuple)):
    return 'a cell is a list of operations, got %r' % (cell,)
  if not cell:
    return 'a cell needs at least one operation'
  for index, operation in enumerate(cell):
    problem = _cell_operation_problem(operation, index)
    if problem:
      return 'operation %d (%s): %s' % (index, _shown(operation), problem)
  return None


def _shown(operation):
  if isinstance(operation, dict):
    return ', '.join('%s: %s' % (k, _shown(v)) for k, v in operation.items())
  if isinstance(operation, (list, tuple)):
    return '[%s]' % ', '.join(_shown(v) for v in operation)
  return repr(operation) if isinstance(operation, str) else str(operation)


def _cell_operation_problem(operation, index):
  if not isinstance(operation, dict):
    return 'an operation is an object with the keys op, input, ...'
  kind = operation.get('op')
  if kind not in CELL_OPERATION_KEYS:
    return 'unknown op %r; known: %s' % (kind, ', '.join(CELL_OPERATION_KEYS))
  unknown = sorted(set(operation) - set(CELL_OPERATION_KEYS[kind]))
  if unknown:
    return 'unknown key(s) %s for op %r; its keys: %s' % (
        ', '.join(map(str, unknown)), kind,
        ', '.join(CELL_OPERATION_KEYS[kind]))
  source = operation.get('input')
  if not _is_int(source) or not -1 <= source < index:
    earlier = ' or the index of an earlier operation (0..%d)' % (
        index - 1) if index else ''
    return 'input must be -1 (the backbone features)%s, got %s' % (
        earlier, _shown(source))
  if kind == 'pyramid_pooling':
    return _pair_problem(operation, 'grid_size', '[rows, columns]')
  problem = _pair_problem(operation, 'kernel', '[height, width]')
  if problem or ('rate' not in operation and
                 cell_pair(operation['kernel']) == (1, 1)):
    return problem
  return _pair_problem(operation, 'rate', '[height, width]')


def _is_int(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _pair_problem(operation, key, pair):
  value = operation.get(key)
  if _is_int(value) and value >= 1:
    return None
  if (isinstance(value, (list, tuple)) and len(value) == 2 and
      all(_is_int(v) and v >= 1 for v in value)):
    return None
  shown = 'nothing' if value is None else _shown(value)
  return ('%s must be a positive integer or %s of positive integers, got %s'
          % (key, pair, shown))


def cell_pair(value):
  """A cell's kernel, rate or grid size as (height, width)."""
  if isinstance(value, (list, tuple)):
    return tuple(value)
  return (value, value)
