"""deeplab-vis legends: entries, drawing, and what vis writes per mode."""
import os

import numpy as np
from PIL import Image
from PIL import ImageFont
import pytest

from deeplab_train import config
from deeplab_train.data import colormap
from deeplab_train.data import datasets
from deeplab_train.evaluation import confusion
from deeplab_train.evaluation import fonts
from deeplab_train.evaluation import legend
from deeplab_train.evaluation import vis

NAMES = ('bg', 'cat', 'dog', 'cow')


def _labels(seed=0, shape=(33, 41)):
  # Skewed shares, so the order is not the id order; class 2 is absent.
  rng = np.random.RandomState(seed)
  return rng.choice(4, shape, p=[0.1, 0.5, 0.0, 0.4]).astype(np.int32)


def _read(path):
  with Image.open(path) as im:
    return np.asarray(im)


def _assert_swatches(pixels, entries, placed):
  """Each swatch box: its colour inside, the border colour on its edge."""
  for entry, (left, top, right, bottom) in zip(entries, placed.swatches):
    inner = pixels[top + legend.BORDER:bottom - legend.BORDER,
                   left + legend.BORDER:right - legend.BORDER]
    assert (inner == entry.colour).all(), entry
    for edge in (pixels[top, left:right], pixels[bottom - 1, left:right],
                 pixels[top:bottom, left], pixels[top:bottom, right - 1]):
      assert (edge == legend.BORDER_COLOUR).all(), entry


def test_entries_are_numpy_counts_largest_first():
  labels = _labels()
  entries = legend.legend_entries(labels, NAMES, 'pascal')
  ids, counts = np.unique(labels, return_counts=True)
  assert sorted(e.class_id for e in entries) == ids.tolist()
  assert 2 not in ids  # absent classes are not listed
  for entry in entries:
    count = counts[ids.tolist().index(entry.class_id)]
    assert entry.share == pytest.approx(count / labels.size)
    assert entry.name == NAMES[entry.class_id]
    assert entry.colour == tuple(colormap.get_colormap('pascal')
                                 [entry.class_id])
  shares = [e.share for e in entries]
  assert shares == sorted(shares, reverse=True)
  assert sum(shares) == pytest.approx(1.0)
  # Ties go by id; unnamed classes are 'class N'.
  tied = legend.legend_entries(np.array([[3, 1], [1, 3]]), None, 'pascal')
  assert [(e.class_id, e.name) for e in tied] == [(1, 'class 1'),
                                                  (3, 'class 3')]
  assert legend.entry_text(tied[0]) == 'class 1 50.0%'
  assert legend.entry_text(entries[0]).startswith('1 cat ')


def test_entries_refuse_bad_labels():
  with pytest.raises(ValueError, match='integers'):
    legend.legend_entries(np.zeros((2, 2), np.float32), None, 'pascal')
  with pytest.raises(ValueError, match='outside the colormap'):
    legend.legend_entries(np.array([[0, 300]]), None, 'pascal')
  with pytest.raises(ValueError, match='below 0'):
    legend.legend_entries(np.array([[0, -1]]), None, 'pascal')
  assert legend.legend_entries(np.zeros((0, 3), np.int32), None,
                               'pascal') == []


def test_legend_image_has_each_swatch_in_a_column():
  entries = legend.legend_entries(_labels(), NAMES, 'pascal')
  placed = legend.layout(entries)
  pixels = np.asarray(legend.legend_image(entries))
  assert pixels.shape == (placed.size[1], placed.size[0], 3)
  assert legend.SWATCH - 2 * legend.BORDER >= 12
  # One column at the left margin, one row per entry, top to bottom.
  assert [box[0] for box in placed.swatches] == [legend.PAD] * len(entries)
  tops = [box[1] for box in placed.swatches]
  assert tops[0] >= legend.PAD and tops == sorted(tops)
  assert len(set(np.diff(tops))) == 1
  _assert_swatches(pixels, entries, placed)
  # Text is drawn right of the swatches, nothing left of them but margin.
  assert (pixels[:, placed.swatches[0][2] + legend.GAP:] != 255).any()
  assert (pixels[:, :legend.PAD] == 255).all()


def test_with_legend_keeps_image_and_widens_it():
  labels = _labels(seed=3)
  colored = colormap.label_to_color_image(labels, 'pascal')
  entries = legend.legend_entries(labels, NAMES, 'pascal')
  framed = legend.with_legend(colored, entries)
  h, w = colored.shape[:2]
  assert framed.dtype == np.uint8 and framed.shape[1] > w
  np.testing.assert_array_equal(framed[:h, :w], colored)
  assert (framed[h:, :w] == 255).all()  # below the image, if taller: white
  # Wrapped into columns to fit the image's height (one row fits in 33 px).
  placed = legend.layout(entries, max_height=h)
  assert framed.shape[0] == max(h, placed.size[1]) == h
  assert framed.shape[1] == w + placed.size[0]
  _assert_swatches(framed[:, w:], entries, placed)
  np.testing.assert_array_equal(legend.with_legend(colored, []), colored)


def test_all_class_entries_name_every_class():
  entries = legend.all_class_entries(21, datasets.PASCAL_VOC_CLASSES,
                                     'pascal')
  assert [e.name for e in entries] == list(datasets.PASCAL_VOC_CLASSES)
  assert all(e.share is None for e in entries)
  assert legend.entry_text(entries[15]) == '15 person'


class _FakePredictor:
  """Predicts fixed label maps, so vis is tested without a network."""

  def __init__(self, labels):
    self._labels = list(labels)

  def predict(self, images, names=None):
    del names
    return [self._labels.pop(0) for _ in images]


def _visualize(out, labels, **vis_fields):
  samples = [{'image': np.zeros(l.shape + (3,), np.float32),
              'name': 'im%d.png' % i, 'height': l.shape[0],
              'width': l.shape[1],
              'original_image': np.full(l.shape + (3,), 90, np.uint8)}
             for i, l in enumerate(labels)]
  return vis.visualize(
      _FakePredictor(labels), samples, str(out), 'pascal',
      config.VisOptions(also_save_raw_predictions=True, save_overlay=True,
                        **vis_fields),
      class_names=NAMES, num_classes=len(NAMES))


def _written(out):
  return {os.path.relpath(os.path.join(d, f), str(out)):
          open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(str(out)) for f in files}


def test_default_writes_exactly_the_unlegended_pngs(tmp_path):
  labels = [_labels(seed=1), _labels(seed=2, shape=(20, 30))]
  assert config.VisOptions().legend == 'none'
  _visualize(tmp_path / 'default', labels)
  written = _written(tmp_path / 'default')
  for i, l in enumerate(labels):
    colored = colormap.label_to_color_image(l, 'pascal')
    image = np.full(l.shape + (3,), 90, np.uint8)
    # Byte for byte what deeplab-vis wrote before legends existed.
    assert written['%s/im%d_prediction.png' % (vis.SEMANTIC_FOLDER, i)] == (
        vis.png_bytes(colored))
    assert written['%s/im%d_overlay.png' % (vis.OVERLAY_FOLDER, i)] == (
        vis.png_bytes(vis.overlay(image, colored)))
  assert vis.LEGEND_FILENAME not in written
  _visualize(tmp_path / 'file', labels, legend='file')
  with_file = _written(tmp_path / 'file')
  legend_png = with_file.pop(vis.LEGEND_FILENAME)
  assert with_file == written  # per-image PNGs unchanged
  pixels = _read(str(tmp_path / 'file' / vis.LEGEND_FILENAME))
  entries = legend.all_class_entries(len(NAMES), NAMES, 'pascal')
  _assert_swatches(pixels, entries, legend.layout(entries))
  assert legend_png == vis.png_bytes(np.asarray(legend.legend_image(entries)))


def test_on_image_legends_prediction_and_overlay_only(tmp_path):
  labels = [_labels(seed=4)]
  _visualize(tmp_path, labels, legend='on_image')
  h, w = labels[0].shape
  colored = colormap.label_to_color_image(labels[0], 'pascal')
  entries = legend.legend_entries(labels[0], NAMES, 'pascal')
  prediction = _read(str(tmp_path / vis.SEMANTIC_FOLDER /
                         'im0_prediction.png'))
  np.testing.assert_array_equal(prediction, legend.with_legend(colored,
                                                               entries))
  side = _read(str(tmp_path / vis.OVERLAY_FOLDER / 'im0_overlay.png'))
  assert side.shape[1] > 3 * w
  np.testing.assert_array_equal(side[:h, w:2 * w], colored)
  # The raw ids and the input image never get a legend.
  np.testing.assert_array_equal(
      _read(str(tmp_path / vis.RAW_FOLDER / 'im0.png')), labels[0])
  assert _read(str(tmp_path / vis.SEMANTIC_FOLDER /
                   'im0_image.png')).shape == (h, w, 3)
  assert not (tmp_path / vis.LEGEND_FILENAME).exists()


def test_unknown_legend_mode_is_refused_as_the_flag():
  from deeplab_train.cli import app
  from deeplab_train.cli import vis as vis_cli
  with pytest.raises(config.ConfigError, match='legend must be one of') as e:
    config.VisOptions(legend='below').validate()
  assert app.user_message(e.value, vis_cli.FLAG_NAMES).startswith(
      '--vis_legend must be one of none/on_image/file')


def test_names_beyond_ascii_are_drawn_or_named_in_a_warning(caplog):
  """Pillow's default font draws ASCII only: 'Pâté', 'кошка' or '猫' came
  out as boxes in legend.png and eval's confusion_matrix.png without a
  word. A system font that draws them is taken (fontconfig), and what none
  draws is named."""
  ascii_font = fonts.font_for(['0 person 12.5%'])
  assert ascii_font.getname() == ImageFont.load_default().getname()
  assert fonts.lacking(ascii_font, set('Pâté'))
  no_glyph = '\U0010fffd'   # private use: no font has it
  with caplog.at_level('WARNING'):
    for name in ('Pâté', 'кошка', '猫', 'x' + no_glyph):
      lacking = fonts.lacking(fonts.font_for([name]), set(name))
      for char in lacking:
        assert 'no font found here draws' in caplog.text, name
        assert char in caplog.text, name
      assert no_glyph not in name or lacking == [no_glyph]
    image = legend.legend_image([legend.LegendEntry(0, 'Pâté', (255, 0, 0))])
    heatmap = confusion.heatmap_image(np.eye(2, dtype=np.int64),
                                      ['Pâté', 'кошка'])
  assert image.size[0] > 2 * legend.PAD and heatmap.size[0] > 0
