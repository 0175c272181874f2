"""Colormaps: the PASCAL bit pattern, dataset tables, colouring and PIL."""
import numpy as np
from PIL import Image
import pytest

from deeplab_train.data import colormap


def test_pascal_colormap_entries():
  cmap = colormap.get_colormap('pascal')
  assert cmap.shape == (256, 3) and cmap.dtype == np.uint8
  assert cmap[:4].tolist() == [[0, 0, 0], [128, 0, 0], [0, 128, 0],
                               [128, 128, 0]]
  assert cmap[15].tolist() == [192, 128, 128]   # person
  assert cmap[255].tolist() == [224, 224, 192]  # VOC's ignore border
  assert len({tuple(c) for c in cmap}) == 256


def test_cityscapes_and_ade20k_are_padded_to_256():
  city = colormap.get_colormap('cityscapes')
  assert city.shape == (256, 3)
  assert city[0].tolist() == [128, 64, 128] and city[18].tolist() == [119, 11, 32]
  assert not city[19:].any()
  ade = colormap.get_colormap('ade20k')
  assert ade.shape == (256, 3)
  assert ade[1].tolist() == [120, 120, 120] and ade[150].tolist() == [92, 0, 255]
  assert not ade[151:].any()
  with pytest.raises(ValueError, match="unknown colormap 'voc'"):
    colormap.get_colormap('voc')


def test_label_to_color_image_and_its_limits():
  labels = np.array([[0, 1], [2, 255]])
  rgb = colormap.label_to_color_image(labels, 'pascal')
  assert rgb.shape == (2, 2, 3) and rgb.dtype == np.uint8
  assert rgb[1, 1].tolist() == [224, 224, 192]
  with pytest.raises(ValueError, match='label value 151 is outside ade20k'):
    colormap.label_to_color_image(np.array([[151]]), 'ade20k')
  with pytest.raises(ValueError, match='label value -1'):
    colormap.label_to_color_image(np.array([[-1]]), 'pascal')
  small = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8)
  assert colormap.label_to_color_image(np.array([1]), small).tolist() == [
      [4, 5, 6]]
  with pytest.raises(ValueError, match='outside the given colormap'):
    colormap.label_to_color_image(np.array([2]), small)
  with pytest.raises(ValueError, match='must be integers'):
    colormap.label_to_color_image(np.array([0.5]), 'pascal')


def test_palette_for_png_round_trips_through_pil(tmp_path):
  ids = np.array([[0, 1, 2], [3, 4, 255]], dtype=np.uint8)
  im = Image.fromarray(ids, 'P')
  palette = colormap.palette_for_png('cityscapes')
  assert len(palette) == 768
  im.putpalette(palette)
  im.save(tmp_path / 'x.png')
  back = Image.open(tmp_path / 'x.png')
  np.testing.assert_array_equal(np.asarray(back), ids)
  np.testing.assert_array_equal(np.asarray(back.convert('RGB')),
                                colormap.get_colormap('cityscapes')[ids])


def test_as_colormap_accepts_a_list_of_colours():
  cmap = colormap.as_colormap([[1, 2, 3], [4, 5, 6]])
  assert cmap.shape == (256, 3) and cmap[1].tolist() == [4, 5, 6]
  with pytest.raises(ValueError, match='r, g, b'):
    colormap.as_colormap([[1, 2]])
