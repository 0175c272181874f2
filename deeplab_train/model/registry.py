"""Backbones registered by `model_variant` name.

Each backbone module registers itself at import time:

    @registry.register('xception_65', mean_pixel=..., ...)
    def build(images, options, is_training, bn_training, weight_decay):
      ...
      return features, end_points

To add a backbone: write a module under `deeplab_train/model/`, decorate its
builder with `register`, and import the module in `model/__init__.py`.
"""
import dataclasses
import importlib
from typing import Callable, Dict, Tuple

import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError

# Normalisation of the inputs, by family.
INCEPTION_MEAN_PIXEL = (127.5, 127.5, 127.5)   # zero_mean_unit_range
IMAGENET_MEAN_RGB = (123.15, 115.90, 103.06)   # plain resnet_v1_50/101


def zero_mean_unit_range(images):
  """Maps pixel values in [0, 255] to [-1, 1]: (2/255) * x - 1 (the
  input of every backbone but the plain resnet_v1_50/101)."""
  return (2.0 / 255.0) * tf.cast(images, tf.float32) - 1.0


@dataclasses.dataclass(frozen=True)
class Backbone:
  """A registered feature extractor.

  Attributes:
    name: the model_variant.
    build: fn(images, options, is_training, bn_training, weight_decay)
      -> (features, end_points). `images` are already normalised; variables
      are created under `scope`. `end_points` maps names (as listed in
      `decoder_end_points`) to tensors.
    scope: top-level variable scope of the backbone (e.g. 'MobilenetV2').
    mean_pixel: the RGB value images are padded with (export, eval, vis).
      It normalises to 0 for every backbone but resnet_v1_18(_beta), which
      pad with 127.5 but subtract the ImageNet mean, as the original does.
    normalize: fn(float images in [0, 255]) -> network input.
    decoder_end_points: {output_stride: (end point names, ...)} for the
      decoder's feature projections.
    default_weight_decay: the L2 factor of conv weights when no
      weight_decay is given: the original trainer's default for this family
      (this entry is the only place it is written).
    uses_drop_path: `build` takes a `drop_path` argument (a
      nas_cell.DropPath: the NAS cells' drop-path regularisation).
    options_read: the BACKBONE_OPTIONS fields `build` reads; the others
      change nothing in this backbone.
  """
  name: str
  build: Callable
  scope: str
  mean_pixel: Tuple[float, float, float]
  normalize: Callable
  decoder_end_points: Dict[int, Tuple[str, ...]]
  default_weight_decay: float
  uses_drop_path: bool = False
  options_read: Tuple[str, ...] = ()


# ModelOptions fields that only some backbones read.
BACKBONE_OPTIONS = ('depth_multiplier', 'divisible_by', 'multi_grid',
                    'nas_stem_output_num_conv_filters',
                    'nas_use_classification_head', 'nas_remove_os32_stride')

_REGISTRY: Dict[str, Backbone] = {}


def register(name, **spec):
  """Decorator registering `build` under `name` with the Backbone fields."""
  def wrap(build):
    if name in _REGISTRY:
      raise ValueError('backbone %r registered twice' % name)
    _REGISTRY[name] = Backbone(name=name, build=build, **spec)
    return build
  return wrap


def known_variants():
  return sorted(_REGISTRY)


def _registered():
  """The registry, once every backbone module registered itself (which
  importing the package does)."""
  importlib.import_module('deeplab_train.model')
  return _REGISTRY


def readers(option):
  """The variants whose backbone reads ModelOptions field `option` (one of
  BACKBONE_OPTIONS), sorted."""
  return sorted(name for name, backbone in _registered().items()
                if option in backbone.options_read)


def get(name) -> Backbone:
  """The registered backbone, or ConfigError listing the known names."""
  try:
    return _registered()[name]
  except KeyError:
    raise ConfigError('unknown {ModelOptions.model_variant}=%r; known '
                      'variants: %s', name,
                      ', '.join(known_variants())) from None


def mean_pixel(name):
  return get(name).mean_pixel
