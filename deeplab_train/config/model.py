"""The network's options (owned by model/): what defines the checkpoint's
variables. Mirrors the original's common.ModelOptions with the flag
defaults of the original common.py / train.py."""
import dataclasses
from typing import Optional, Tuple

from deeplab_train.config.errors import check
from deeplab_train.config.serialize import JsonMixin
from deeplab_train.config.serialize import set_field
from deeplab_train.config.serialize import tuple_or_none

OUTPUT_STRIDES = (4, 8, 16, 32)
MERGE_METHODS = ('max', 'avg')


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
    image_se_uses_qsigmoid: that gate is a hard sigmoid, relu6(x + 3) / 6.
    decoder_use_sum_merge: the decoder adds its projected features to the
      upsampled ones instead of concatenating them.
    decoder_output_is_logits: the decoder's last layer gives the logits.
    nas_stem_output_num_conv_filters / nas_use_classification_head /
      nas_remove_os32_stride: the NAS backbones' architecture options.
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

  def validate(self):
    """Raises ConfigError naming the offending field; returns self."""
    check(self.num_classes >= 1,
          'num_classes must be >= 1, got %d' % self.num_classes)
    stride = self.output_stride
    check(stride in OUTPUT_STRIDES, '{ModelOptions.output_stride} must be 4, '
          '8, 16 or 32, got %d' % stride)
    decoder = self.decoder_output_stride or ()
    check(all(s < stride and stride % s == 0 for s in decoder),
          '{ModelOptions.decoder_output_stride}=%s must divide and be smaller '
          'than {ModelOptions.output_stride}=%d'
          % (','.join(map(str, decoder)), stride))
    check(list(decoder) == sorted(decoder, reverse=True),
          '{ModelOptions.decoder_output_stride} must be in decreasing order, '
          'e.g. 8,4; got %s' % (self.decoder_output_stride,))
    check(self.crop_size is None or len(self.crop_size) == 2,
          'crop size must be HEIGHT,WIDTH, got %s' % (self.crop_size,))
    check(self.merge_method in MERGE_METHODS, "{ModelOptions.merge_method} "
          "must be 'max' or 'avg', got %r" % self.merge_method)
    check(self.depth_multiplier > 0,
          '{ModelOptions.depth_multiplier} must be > 0')
    check(self.logits_kernel_size >= 1,
          '{ModelOptions.logits_kernel_size} must be >= 1')
    return self
