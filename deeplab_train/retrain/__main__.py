"""python -m deeplab_train.retrain: see deeplab_train/cli/retrain.py."""
from deeplab_train.cli import retrain

if __name__ == '__main__':
  retrain.run()
