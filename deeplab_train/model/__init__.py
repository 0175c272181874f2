"""DeepLabv3+ network: backbones (registered by name), ASPP, decoder, logits.

Importing this package registers every backbone module; `head` holds ASPP,
the decoder and the logits, `deeplab` the meta-architecture and the
inference functions.
"""
# Backbone modules register their model_variants on import.
from deeplab_train.model import mobilenet_edgetpu  # noqa: F401
from deeplab_train.model import mobilenet_v2  # noqa: F401
from deeplab_train.model import mobilenet_v3  # noqa: F401
from deeplab_train.model import nas_network  # noqa: F401
from deeplab_train.model import resnet  # noqa: F401
from deeplab_train.model import xception  # noqa: F401
from deeplab_train.model.registry import known_variants  # noqa: F401
