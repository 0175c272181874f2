"""DeepLabv3+ network: backbones (registered by name), ASPP, decoder, logits.

Importing this package registers every backbone module.
"""
import importlib

from deeplab_train.model.registry import known_variants  # noqa: F401

# Backbone modules register themselves on import; a module that has not
# landed yet is skipped so the rest of the package stays usable.
for _name in ('mobilenet_v2', 'xception', 'resnet'):
  try:
    importlib.import_module('deeplab_train.model.' + _name)
  except ModuleNotFoundError as e:
    if e.name != 'deeplab_train.model.' + _name:
      raise
