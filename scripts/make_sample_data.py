#!/usr/bin/env python3
"""Writes the bundled sample dataset `data/` (PASCAL VOC layout).

    python scripts/make_sample_data.py [--output_dir data] [--seed 0]

Deterministic (numpy + PIL only): the same seed gives the same files.

Layout:
  JPEGImages/<id>.jpg                 RGB, JPEG quality 90
  SegmentationClass/<id>.png          palette PNGs with the PASCAL colormap
  ImageSets/Segmentation/{train,val}.txt

Content: a noisy, low-saturation textured background (class 0) with 1-4
objects of four classes, each with its own colour AND shape/texture so a
small network separates them quickly:

  1 red disk            solid red, slight shading
  2 green square        green with dark diagonal stripes, rotated
  3 blue triangle       blue with light dots, rotated
  4 yellow ring         yellow annulus (background shows through the hole)

As in VOC, a thin band of 255 ("ignore") covers every class boundary: the
pixels whose 3x3 neighbourhood holds another class (about 2 px wide). Image
sides vary between 120 and 260 px, mostly not square, so resizing and
padding are exercised. The ids are PASCAL's 1..4 (drawn in its colours) and
the dataset is converted with --num_classes=5 (see scripts/demo.sh).
"""
import argparse
import os

import numpy as np
from PIL import Image

NUM_TRAIN = 100
NUM_VAL = 30
MIN_SIDE, MAX_SIDE = 120, 260
IGNORE = 255
JPEG_QUALITY = 90
CLASS_NAMES = ('background', 'red_disk', 'green_striped_square',
               'blue_dotted_triangle', 'yellow_ring')


def pascal_palette():
  """The PASCAL VOC colormap as PIL's flat 768-entry palette."""
  ids = np.arange(256)
  cmap = np.zeros((256, 3), dtype=np.int64)
  for shift in range(7, -1, -1):
    for channel in range(3):
      cmap[:, channel] |= ((ids >> channel) & 1) << shift
    ids = ids >> 3
  return [int(v) for v in cmap.reshape(-1)]


def smooth_noise(rng, height, width, cell):
  """Low-frequency noise in [0, 1]: a coarse random grid upsampled."""
  gh, gw = height // cell + 2, width // cell + 2
  grid = rng.rand(gh, gw).astype(np.float32)
  coarse = Image.fromarray((grid * 255).astype(np.uint8))
  fine = coarse.resize((gw * cell, gh * cell), Image.BILINEAR)
  return np.asarray(fine, dtype=np.float32)[:height, :width] / 255.0


def background(rng, height, width):
  """Grey-brown texture: blotches + grain, low saturation."""
  base = rng.uniform(70, 170)
  tint = rng.uniform(-12, 12, size=3)
  blotch = smooth_noise(rng, height, width, int(rng.randint(12, 40)))
  streak = smooth_noise(rng, height, width, 6)
  grey = base + 60 * (blotch - 0.5) + 20 * (streak - 0.5)
  image = grey[..., None] + tint[None, None, :]
  image += rng.normal(0, 8, size=(height, width, 1))
  return image


def polygon_mask(yy, xx, vertices):
  """Pixels inside a convex polygon (vertices in counter-clockwise order)."""
  inside = np.ones(yy.shape, dtype=bool)
  n = len(vertices)
  for i in range(n):
    (y0, x0), (y1, x1) = vertices[i], vertices[(i + 1) % n]
    cross = (x1 - x0) * (yy - y0) - (y1 - y0) * (xx - x0)
    inside &= cross >= 0
  return inside


def regular_polygon(cy, cx, radius, sides, angle):
  angles = angle + 2 * np.pi * np.arange(sides) / sides
  # Counter-clockwise in (row, col) coordinates for polygon_mask.
  return [(cy - radius * np.sin(a), cx + radius * np.cos(a))
          for a in angles[::-1]]


def draw_object(rng, image, label, class_id, yy, xx):
  """Paints one object of `class_id` into image and label in place."""
  height, width = label.shape
  radius = rng.uniform(22, max(24, min(height, width) / 3.0))
  cy = rng.uniform(radius * 0.6, height - radius * 0.6)
  cx = rng.uniform(radius * 0.6, width - radius * 0.6)
  dist = np.hypot(yy - cy, xx - cx)
  shade = rng.uniform(0.8, 1.05)
  if class_id == 1:  # red disk
    mask = dist <= radius
    colour = np.array([215, 35, 30]) * shade
    texture = 1.0 - 0.15 * (dist / radius)[..., None]
  elif class_id == 2:  # green square, dark diagonal stripes
    mask = polygon_mask(yy, xx, regular_polygon(cy, cx, radius * 1.2, 4,
                                                rng.uniform(0, np.pi / 2)))
    colour = np.array([40, 190, 60]) * shade
    period = rng.uniform(7, 11)
    stripes = ((yy + xx) / period) % 1.0 < 0.45
    texture = np.where(stripes, 0.45, 1.0)[..., None]
  elif class_id == 3:  # blue triangle, light dots
    mask = polygon_mask(yy, xx, regular_polygon(cy, cx, radius * 1.3, 3,
                                                rng.uniform(0, 2 * np.pi)))
    colour = np.array([35, 60, 210]) * shade
    dots = (np.hypot((yy % 8) - 4, (xx % 8) - 4) < 1.6)
    texture = np.where(dots, 1.8, 1.0)[..., None]
  else:  # yellow ring
    inner = radius * rng.uniform(0.4, 0.6)
    mask = (dist <= radius) & (dist >= inner)
    colour = np.array([230, 210, 40]) * shade
    texture = np.ones(mask.shape + (1,))
  painted = colour[None, None, :] * texture
  image[mask] = painted[mask]
  label[mask] = class_id


def ignore_band(label):
  """255 where the 3x3 neighbourhood holds more than one class."""
  padded = np.pad(label, 1, mode='edge')
  height, width = label.shape
  lo = label.copy()
  hi = label.copy()
  for dy in (0, 1, 2):
    for dx in (0, 1, 2):
      window = padded[dy:dy + height, dx:dx + width]
      lo = np.minimum(lo, window)
      hi = np.maximum(hi, window)
  out = label.copy()
  out[lo != hi] = IGNORE
  return out


def make_pair(rng):
  height = int(rng.randint(MIN_SIDE, MAX_SIDE + 1))
  width = int(rng.randint(MIN_SIDE, MAX_SIDE + 1))
  yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
  image = background(rng, height, width)
  label = np.zeros((height, width), dtype=np.uint8)
  classes = rng.randint(1, 5, size=int(rng.randint(1, 5)))
  for class_id in classes:
    draw_object(rng, image, label, int(class_id), yy, xx)
  image += rng.normal(0, 4, size=image.shape)  # sensor grain over all
  image = np.clip(np.round(image), 0, 255).astype(np.uint8)
  return image, ignore_band(label)


def write_pair(output_dir, name, image, label, palette):
  Image.fromarray(image, 'RGB').save(
      os.path.join(output_dir, 'JPEGImages', name + '.jpg'),
      quality=JPEG_QUALITY)
  png = Image.fromarray(label, 'P')
  png.putpalette(palette)
  png.save(os.path.join(output_dir, 'SegmentationClass', name + '.png'),
           optimize=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output_dir', default=os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data'))
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--num_train', type=int, default=NUM_TRAIN)
  parser.add_argument('--num_val', type=int, default=NUM_VAL)
  args = parser.parse_args()

  for sub in ('JPEGImages', 'SegmentationClass',
              os.path.join('ImageSets', 'Segmentation')):
    os.makedirs(os.path.join(args.output_dir, sub), exist_ok=True)
  palette = pascal_palette()
  rng = np.random.RandomState(args.seed)
  splits = {'train': ['train_%04d' % i for i in range(args.num_train)],
            'val': ['val_%04d' % i for i in range(args.num_val)]}
  for split, names in splits.items():
    for name in names:
      image, label = make_pair(rng)
      write_pair(args.output_dir, name, image, label, palette)
    list_path = os.path.join(args.output_dir, 'ImageSets', 'Segmentation',
                             split + '.txt')
    with open(list_path, 'w') as f:
      f.write(''.join(n + '\n' for n in names))
  print('wrote %d train / %d val pairs to %s'
        % (args.num_train, args.num_val, args.output_dir))


if __name__ == '__main__':
  main()
