"""deeplab-train: DeepLabv3+ semantic segmentation on TensorFlow's graph API."""
__version__ = '0.1.0'
