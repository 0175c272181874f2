"""Tiny Cityscapes folders (leftImg8bit/ and gtFine/ by split and city)
for the converter's tests and for the reference the original converter
recorded from them (benchmarks/record_original_cityscapes.py).

numpy and Pillow only: the recorder imports it in the original's
environment.
"""
import os

import numpy as np
from PIL import Image

# Label ids of the dataset with the train id each stands for (255: not
# trained on): unlabeled, road, parking, building, guard rail, sky, 255,
# bicycle.
LABEL_IDS = np.array([0, 7, 9, 11, 14, 23, 255, 33], dtype=np.uint8)
TRAIN_IDS = np.array([255, 0, 255, 2, 255, 10, 255, 18], dtype=np.uint8)

# The tree of the recorded reference: {split: [(city, images)]}, train ids.
REFERENCE_TREE = {'train': [('bremen', 2), ('aachen', 3)],
                  'val': [('lindau', 2)]}
REFERENCE_SEED = 20261205


def write_city(root, split, city, count, seed, labels='train_ids'):
  """Writes `count` images of one city; returns {stem: train ids}.

  Args:
    root: the Cityscapes root.
    split / city: the folders under leftImg8bit/ and gtFine/.
    count: images to write, of 17 to 29 pixels a side.
    seed: of the random pixels and labels.
    labels: 'train_ids' (*_gtFine_labelTrainIds.png), 'label_ids'
      (*_gtFine_labelIds.png, with the instance ids and colours the
      dataset ships beside them) or None (no label).
  """
  rng = np.random.default_rng(seed)
  image_dir = os.path.join(root, 'leftImg8bit', split, city)
  label_dir = os.path.join(root, 'gtFine', split, city)
  os.makedirs(image_dir, exist_ok=True)
  os.makedirs(label_dir, exist_ok=True)
  want = {}
  for i in range(count):
    stem = '%s_%06d_000019' % (city, i)
    height, width = (int(v) for v in rng.integers(17, 30, size=2))
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(image).save(
        os.path.join(image_dir, stem + '_leftImg8bit.png'))
    # Regions of 4x4 pixels, each one of the label ids above.
    regions = rng.integers(0, len(LABEL_IDS),
                           (height // 4 + 1, width // 4 + 1))
    index = regions.repeat(4, axis=0).repeat(4, axis=1)[:height, :width]
    path = os.path.join(label_dir, stem + '_gtFine_')
    if labels == 'train_ids':
      Image.fromarray(TRAIN_IDS[index], 'L').save(path + 'labelTrainIds.png')
    elif labels == 'label_ids':
      Image.fromarray(LABEL_IDS[index], 'L').save(path + 'labelIds.png')
      Image.fromarray(LABEL_IDS[index].astype(np.uint16) * 1000).save(
          path + 'instanceIds.png')
      Image.fromarray(image[::-1]).save(path + 'color.png')
    want[stem] = TRAIN_IDS[index]
  return want


def write_reference_tree(root):
  """Writes REFERENCE_TREE."""
  for split, cities in REFERENCE_TREE.items():
    for number, (city, count) in enumerate(cities):
      write_city(root, split, city, count,
                 REFERENCE_SEED + 100 * number + len(split))
