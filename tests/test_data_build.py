"""deeplab-build-data: layouts, validation errors, shards, dataset.json, CLI,
and the committed sample data.

Over 400 lines on purpose: one test per failure the converter names (each a
few lines on the shared tiny VOC folders of test_data_common), kept with the
command they describe.
"""
import errno
import io
import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

from deeplab_train.config import ConfigError
from deeplab_train.data import build
from deeplab_train.data import colormap
from deeplab_train.data import datasets
import test_data_common as common
import train_testing as tt

OPTIONS = build.BuildOptions(num_classes=4, dataset_name='tiny',
                             num_shards=2)


def read_records(path):
  """[(features dict, image array, label ids)] of a shard."""
  out = []
  for raw in tf.io.tf_record_iterator(path):
    feature = tf.train.Example.FromString(raw).features.feature
    image = np.asarray(Image.open(io.BytesIO(
        feature['image/encoded'].bytes_list.value[0])))
    label_im = Image.open(io.BytesIO(
        feature['image/segmentation/class/encoded'].bytes_list.value[0]))
    assert label_im.mode == 'L'  # single channel of ids, not a palette
    out.append((feature, image, np.asarray(label_im)))
  return out


def all_records(output_dir, split, num_shards):
  records = []
  for i in range(num_shards):
    records += read_records(os.path.join(
        output_dir, '%s-%05d-of-%05d.tfrecord' % (split, i, num_shards)))
  return records


def records_by_name(output_dir, split, num_shards):
  """{image/filename: (features, image, label ids)} of a split's records,
  in their order."""
  return {r[0]['image/filename'].bytes_list.value[0].decode(): r
          for r in all_records(output_dir, split, num_shards)}


def voc(tmp_path, splits, **kwargs):
  return common.write_voc_folder(str(tmp_path / 'voc'), splits, **kwargs)


def build_voc(*args, **kwargs):
  """build.build_voc for the PNG images the helpers write by default."""
  kwargs.setdefault('image_format', 'png')
  return build.build_voc(*args, **kwargs)


def test_voc_layout_to_shards_and_dataset_json(tmp_path):
  train = common.tiny_pairs(0, 5, prefix='tr')
  val = common.tiny_pairs(1, 3, prefix='va')
  images, labels, lists = voc(tmp_path, {'train': train, 'val': val})
  out = str(tmp_path / 'out')
  info = build_voc(images, labels, lists, out, OPTIONS)
  assert sorted(os.listdir(out)) == [
      'dataset.json', 'train-00000-of-00002.tfrecord',
      'train-00001-of-00002.tfrecord', 'val-00000-of-00002.tfrecord',
      'val-00001-of-00002.tfrecord']
  with open(os.path.join(out, 'dataset.json')) as f:
    saved = json.load(f)
  counted = saved.pop('statistics')  # see test_data_stats.py
  assert saved == {'name': 'tiny', 'num_classes': 4, 'ignore_label': 255,
                   'splits_to_sizes': {'train': 5, 'val': 3},
                   'class_names': None, 'palette': 'pascal'}
  for split, pairs in (('train', train), ('val', val)):
    assert counted[split]['num_images'] == len(pairs)
    assert counted[split]['class_pixels'] == np.bincount(
        np.concatenate([ids.ravel() for _, _, ids in pairs]),
        minlength=4).tolist()
  assert info == datasets.read_dataset_json(out)
  records = all_records(out, 'train', 2)
  assert [r[0]['image/filename'].bytes_list.value[0] for r in records] == [
      name.encode() for name, _, _ in train]  # contiguous shards, in order
  for (feature, image, ids), (name, want_image, want_ids) in zip(records,
                                                                 train):
    assert feature['image/format'].bytes_list.value == [b'png']
    assert feature['image/height'].int64_list.value == [want_ids.shape[0]]
    assert feature['image/width'].int64_list.value == [want_ids.shape[1]]
    with open(os.path.join(images, name + '.png'), 'rb') as f:
      assert feature['image/encoded'].bytes_list.value[0] == f.read()
    np.testing.assert_array_equal(image, want_image)
    np.testing.assert_array_equal(ids, want_ids)


def test_jpeg_images_are_stored_as_is(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(2, 2)},
                              image_format='jpg')
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out,
            build.BuildOptions(num_classes=4, num_shards=1), image_format='jpg')
  feature = read_records(os.path.join(out, 'train-00000-of-00001.tfrecord'))[
      0][0]
  assert feature['image/format'].bytes_list.value == [b'jpeg']
  with open(os.path.join(images, 'img_00.jpg'), 'rb') as f:
    assert feature['image/encoded'].bytes_list.value[0] == f.read()


def test_a_phones_multi_picture_jpeg_is_stored_as_its_first_picture(
    tmp_path):
  """An MPO (a JPEG followed by more pictures: previews, the other eye)
  was re-encoded as PNG, about 6 times larger. Its first picture is a JPEG
  of its own; a label saved as MPO is refused as a JPEG is."""
  pairs = common.tiny_pairs(2, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs}, image_format='jpg')
  path = os.path.join(images, 'img_00.jpg')
  first = Image.fromarray(pairs[0][1])
  first.save(path, format='MPO', save_all=True,
             append_images=[first.resize((8, 6))])
  with open(path, 'rb') as f:
    data = f.read()
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out,
            build.BuildOptions(num_classes=4, num_shards=1), image_format='jpg')
  feature, image, _ = read_records(
      os.path.join(out, 'train-00000-of-00001.tfrecord'))[0]
  assert feature['image/format'].bytes_list.value == [b'jpeg']
  stored = feature['image/encoded'].bytes_list.value[0]
  assert len(stored) < len(data) and data.startswith(stored)
  assert image.shape == pairs[0][1].shape
  np.testing.assert_array_equal(
      tf.image.decode_jpeg(stored).numpy(),
      tf.image.decode_jpeg(data).numpy())

  Image.fromarray(pairs[1][2].astype(np.uint8)).save(
      os.path.join(labels, 'img_01.png'), format='MPO')
  with pytest.raises(build.DataError, match=r'img_01.png is a JPEG file'):
    build_voc(images, labels, lists, str(tmp_path / 'out2'), OPTIONS,
              image_format='jpg')


def test_builtin_name_brings_class_names_and_palette(tmp_path):
  images, labels, lists = voc(tmp_path, {'val': common.tiny_pairs(3, 2)})
  out = str(tmp_path / 'out')
  info = build_voc(images, labels, lists, out,
                         build.BuildOptions(num_shards=1))
  assert info.name == 'pascal_voc_seg' and info.num_classes == 21
  assert info.class_names == datasets.PASCAL_VOC_CLASSES
  assert info.palette == 'pascal'


def test_one_split_at_a_time_merges_into_dataset_json(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(4, 3),
                                         'val': common.tiny_pairs(5, 2)})
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS, split_name='train')
  info = build_voc(images, labels, lists, out, OPTIONS,
                         split_name='val')
  assert info.splits_to_sizes == {'train': 3, 'val': 2}
  with pytest.raises(ConfigError, match=r'dataset.json says num_classes=4'):
    build_voc(images, labels, lists, out,
                    build.BuildOptions(num_classes=6, num_shards=2),
                    split_name='val')
  with pytest.raises(ConfigError, match=r'no test.txt'):
    build_voc(images, labels, lists, out, OPTIONS, split_name='test')


def test_rebuild_with_fewer_shards_removes_the_old_ones(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(6, 4)})
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out,
            build.BuildOptions(num_classes=4, num_shards=3,
                               dataset_name='tiny'))
  build_voc(images, labels, lists, out, OPTIONS)
  assert sorted(f for f in os.listdir(out) if f.endswith('.tfrecord')) == [
      'train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord']
  # A split added without the dataset's name (the default, pascal_voc_seg)
  # renamed the dataset and gave it the pascal palette, silently.
  before = common.folder_contents(out)
  with pytest.raises(ConfigError, match=(
      "dataset.json is of dataset 'tiny' but this run uses "
      'dataset_name=pascal_voc_seg; give dataset_name=tiny')):
    build_voc(images, labels, lists, out, build.BuildOptions(num_classes=4))
  assert common.folder_contents(out) == before


@pytest.mark.parametrize('fault', ['bad_val_label', 'disk_full'])
def test_failed_rebuild_leaves_the_old_build_as_it_was(tmp_path, monkeypatch,
                                                       fault):
  good = voc(tmp_path / 'good', {'train': common.tiny_pairs(20, 4, prefix='tr'),
                                 'val': common.tiny_pairs(21, 2, prefix='va')})
  out = str(tmp_path / 'out')
  build_voc(*good, out, build.BuildOptions(num_classes=4, num_shards=3,
                                           dataset_name='tiny'))
  before = common.folder_contents(out)
  val = common.tiny_pairs(23, 2, prefix='va')
  if fault == 'bad_val_label':
    val[1][2][0, 0] = 9
  new = voc(tmp_path / 'new', {'train': common.tiny_pairs(22, 5, prefix='tr'),
                               'val': val})
  if fault == 'disk_full':
    write_shard = build._write_shard

    def full_on_val(entries, temp_path, options, stop):
      if 'val-' in temp_path:
        raise OSError(errno.ENOSPC, 'No space left on device', temp_path)
      return write_shard(entries, temp_path, options, stop)
    monkeypatch.setattr(build, '_write_shard', full_on_val)
  # Train is converted first (and would be complete) before val fails.
  with pytest.raises((build.DataError, OSError)):
    build_voc(*new, out, OPTIONS)
  # Byte-identical, no temp files left.
  assert common.folder_contents(out) == before


def test_non_utf8_list_line_is_named(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(24, 2)})
  with open(os.path.join(lists, 'train.txt'), 'ab') as f:
    f.write(b'caf\xe9\n')  # Latin-1, not UTF-8
  with pytest.raises(build.DataError,
                     match=r'train.txt line 3 is not UTF-8 text'):
    build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)


def test_non_utf8_file_name_is_named(tmp_path):
  images, labels, _ = voc(tmp_path, {'train': common.tiny_pairs(25, 2)})
  bad = os.fsdecode(b'caf\xe9.png')
  os.rename(os.path.join(images, 'img_00.png'), os.path.join(images, bad))
  with pytest.raises(build.DataError,
                     match=r"file name 'caf\\udce9.png' is not UTF-8"):
    build.build_generic(images, labels, 'train', str(tmp_path / 'out'),
                        OPTIONS)


def test_repeated_ids_are_converted_once_with_a_warning(tmp_path, caplog):
  pairs = common.tiny_pairs(26, 3)
  images, labels, lists = voc(tmp_path, {'train': pairs})
  with open(os.path.join(lists, 'train.txt'), 'a') as f:
    f.write('img_01\nimg_00\n')
  out = str(tmp_path / 'out')
  with caplog.at_level('WARNING'):
    info = build_voc(images, labels, lists, out, OPTIONS)
  assert info.splits_to_sizes == {'train': 3}
  assert 'lists 2 id(s) more than once (img_00, img_01)' in caplog.text
  names = [r[0]['image/filename'].bytes_list.value[0]
           for r in all_records(out, 'train', 2)]
  assert names == [b'img_00', b'img_01', b'img_02']


def test_a_list_saved_with_a_byte_order_mark_is_read(tmp_path):
  """Notepad's BOM was taken into the first id, which then named a file
  that seemed to exist ('missing: .../\ufeffimg_00.png')."""
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(34, 2)})
  with open(os.path.join(lists, 'train.txt'), 'wb') as f:
    f.write(b'\xef\xbb\xbfimg_00\r\nimg_01\r\n')
  info = build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)
  assert info.splits_to_sizes == {'train': 2}


def test_listed_names_are_found_in_either_unicode_form(tmp_path):
  """A list naming 'Küche' composed (most editors) and files named with it
  decomposed (macOS): 'missing' named a file that seemed to be there."""
  composed = 'K\u00fcche'
  pairs = [(unicodedata.normalize('NFD', composed),) + pair[1:]
           for pair in common.tiny_pairs(36, 1)]
  images, labels, lists = voc(tmp_path, {'train': pairs})
  with open(os.path.join(lists, 'train.txt'), 'w', encoding='utf-8') as f:
    f.write(composed + '\n')
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS)
  (feature, _, ids), = all_records(out, 'train', 2)
  assert feature['image/filename'].bytes_list.value[0].decode() == composed
  np.testing.assert_array_equal(ids, pairs[0][2])


def test_16_bit_grey_png_is_scaled_to_8_bits(tmp_path):
  pairs = common.tiny_pairs(27, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs})
  height, width = pairs[0][2].shape
  deep = (np.arange(height * width).reshape(height, width) * 65535
          // (height * width - 1)).astype(np.uint16)
  Image.fromarray(deep).save(os.path.join(images, 'img_00.png'))
  assert Image.open(os.path.join(images, 'img_00.png')).mode.startswith('I')
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS)
  _, image, _ = all_records(out, 'train', 2)[0]
  want = np.rint(deep / 257.0).astype(np.uint8)
  assert image.shape == (height, width, 3)
  for channel in range(3):
    np.testing.assert_array_equal(image[..., channel], want)
  assert 0 < image.mean() < 255  # not all white (PIL's convert clips)


def test_rgb_colour_labels_are_converted_to_ids(tmp_path):
  pairs = common.tiny_pairs(7, 2)
  pairs[0][2][:2, :] = 255  # VOC's ignore colour (224, 224, 192)
  images, labels, lists = voc(tmp_path, {'train': pairs}, label_mode='RGB')
  assert Image.open(os.path.join(labels, 'img_00.png')).mode == 'RGB'
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS)
  for (_, _, ids), (_, _, want) in zip(all_records(out, 'train', 2), pairs):
    np.testing.assert_array_equal(ids, want)


def test_grey_id_labels_are_read_as_ids(tmp_path):
  pairs = common.tiny_pairs(8, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs}, label_mode='L')
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS)
  for (_, _, ids), (_, _, want) in zip(all_records(out, 'train', 2), pairs):
    np.testing.assert_array_equal(ids, want)


def assert_build_fails(tmp_path, pairs, match, options=OPTIONS, **kwargs):
  images, labels, lists = voc(tmp_path, {'train': pairs}, **kwargs)
  out = str(tmp_path / 'out')
  with pytest.raises(build.DataError, match=match):
    build_voc(images, labels, lists, out, options)
  # Nothing that looks finished, no temp files left behind.
  assert not os.path.exists(out) or os.listdir(out) == []
  return labels


def test_rgb_label_refused_when_conversion_is_off(tmp_path):
  assert_build_fails(
      tmp_path, common.tiny_pairs(9, 3),
      r'SegmentationClass/img_0\d.png is an RGB colour label',
      options=build.BuildOptions(num_classes=4, num_shards=2,
                                 convert_rgb_labels=False),
      label_mode='RGB')


def test_rgb_label_with_unknown_colours_names_them(tmp_path):
  pairs = common.tiny_pairs(10, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs}, label_mode='RGB')
  rgb = np.array(Image.open(os.path.join(labels, 'img_01.png')))
  rgb[0, :3] = (1, 2, 3)
  Image.fromarray(rgb).save(os.path.join(labels, 'img_01.png'))
  with pytest.raises(build.DataError,
                     match=r'img_01.png: RGB label has 1 colour\(s\) not in '
                           r'the pascal palette.*\(1,2,3\) x3'):
    build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)


def test_out_of_range_label_names_file_and_values(tmp_path):
  pairs = common.tiny_pairs(11, 3)
  pairs[2][2][0, 0] = 7
  pairs[2][2][1, 1] = 9
  pairs[1][2][0, 0] = 255  # the ignore label is allowed
  assert_build_fails(tmp_path, pairs,
                     r'img_02.png: label values 7, 9 are outside \[0, 4\)')


def test_jpeg_label_is_refused_by_its_format(tmp_path):
  """Grey ids saved as JPEG (even named .png) were accepted with the
  compression's in-between ids at every edge."""
  pairs = common.tiny_pairs(31, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs}, label_mode='L')
  Image.fromarray(pairs[1][2].astype(np.uint8)).save(
      os.path.join(labels, 'img_01.png'), format='JPEG', quality=75)
  with pytest.raises(build.DataError,
                     match=r'img_01.png is a JPEG file: its compression '
                           r'blurs the class ids.*save the labels as PNG'):
    build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)


def _renumbered_palette_label(path, ids):
  """`ids` saved as a palette PNG whose index i has the pascal colour of id
  (i + 1) % 4: what an editor's indexed mode makes of a VOC label."""
  pascal = colormap.get_colormap('pascal')
  palette = np.zeros((256, 3), np.uint8)
  for i in range(4):
    palette[i] = pascal[(i + 1) % 4]
  im = Image.fromarray(((ids.astype(np.int64) + 3) % 4).astype(np.uint8),
                       mode='P')
  im.putpalette(palette.reshape(-1).tolist())
  im.save(path)


def test_a_renumbered_palette_label_is_refused(tmp_path):
  """Its indices were read as ids: every class shifted, without a word."""
  pairs = common.tiny_pairs(32, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs})
  ids = pairs[0][2]
  _renumbered_palette_label(os.path.join(labels, 'img_00.png'), ids)
  # The colours it shows are the right classes.
  shown = np.asarray(Image.open(os.path.join(labels, 'img_00.png')).convert(
      'RGB'))
  np.testing.assert_array_equal(
      shown, colormap.get_colormap('pascal')[ids])
  with pytest.raises(build.DataError) as error:
    build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)
  assert str(error.value).startswith(
      os.path.join(labels, 'img_00.png') + ": its palette holds the pascal "
      "palette's colours at other indices (index 0 has the colour "
      '(128,0,0) of id 1, ')
  assert str(error.value).endswith(
      'if its indices are the class ids, pass convert_rgb_labels=false')
  # Told that the indices are the ids, the build reads them as such.
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, build.BuildOptions(
      num_classes=4, num_shards=2, convert_rgb_labels=False))
  np.testing.assert_array_equal(all_records(out, 'train', 2)[0][2],
                                (ids.astype(np.int64) + 3) % 4)


def test_palette_labels_of_their_own_colours_are_read_as_ids(tmp_path):
  pairs = common.tiny_pairs(33, 2)
  images, labels, lists = voc(tmp_path, {'train': pairs})
  for (name, _, ids), palette in zip(pairs, (
      [0] * 768,  # one colour for every index: it says nothing
      [v for i in range(256) for v in (i, i, i)])):  # a grey ramp
    im = Image.fromarray(ids.astype(np.uint8), mode='P')
    im.putpalette(palette)
    im.save(os.path.join(labels, name + '.png'))
  out = str(tmp_path / 'out')
  build_voc(images, labels, lists, out, OPTIONS)
  for (_, _, ids), (_, _, want) in zip(all_records(out, 'train', 2), pairs):
    np.testing.assert_array_equal(ids, want)


def test_size_mismatch_names_both_files(tmp_path):
  pairs = common.tiny_pairs(12, 2, sizes=[(20, 24), (21, 25)])
  pairs[1] = (pairs[1][0], pairs[1][1], pairs[1][2][:, :-1])
  assert_build_fails(tmp_path, pairs,
                     r'size mismatch: image \S*img_01.png is 21x25 '
                     r'\(height x width\) but label \S*img_01.png is 21x24')


def _save_with_orientation(path, image, orientation):
  exif = Image.Exif()
  exif[0x0112] = orientation
  Image.fromarray(image).save(path, exif=exif)


def test_images_with_an_exif_orientation_are_named(tmp_path, caplog):
  """Phone photos: viewers turn them, TensorFlow does not. A label drawn on
  the turned photo did not line up, without a word; one of swapped size
  was a plain size mismatch."""
  pairs = common.tiny_pairs(35, 2, sizes=[(20, 20), (20, 28)])
  images, labels, lists = voc(tmp_path, {'train': pairs})
  square = os.path.join(images, 'img_00.png')
  _save_with_orientation(square, pairs[0][1], 3)
  out = str(tmp_path / 'out')
  with caplog.at_level('WARNING'):
    build_voc(images, labels, lists, out, OPTIONS)
  assert ('1 image(s) carry an EXIF orientation that viewers apply (turned '
          'or mirrored): %s. Their pixels are stored as the files hold them'
          % square) in caplog.text
  # Stored as the file holds them.
  np.testing.assert_array_equal(all_records(out, 'train', 2)[0][1],
                                pairs[0][1])

  _save_with_orientation(os.path.join(images, 'img_01.png'), pairs[1][1], 6)
  common.save_label(os.path.join(labels, 'img_01.png'), pairs[1][2].T)
  with pytest.raises(build.DataError,
                     match=r'img_01.png is 20x28 \(height x width\) but '
                           r'label \S+ is 28x20; the image carries EXIF '
                           r'orientation 6, '
                           r'which viewers apply'):
    build_voc(images, labels, lists, str(tmp_path / 'out2'), OPTIONS)


def test_pillows_warnings_that_name_no_file_are_said_naming_it(
    tmp_path, caplog, monkeypatch):
  """A large image printed Pillow's 'could be decompression bomb DOS
  attack' without its path; an EXIF orientation of 9 (none of EXIF's 1..8)
  was reported as one that viewers apply."""
  import warnings  # pylint: disable=g-import-not-at-top
  pairs = common.tiny_pairs(37, 2, sizes=[(20, 20), (20, 28)])
  images, labels, lists = voc(tmp_path, {'train': pairs})
  odd = os.path.join(images, 'img_00.png')
  _save_with_orientation(odd, pairs[0][1], 9)
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 500)   # 560 > 500
  with caplog.at_level('WARNING'), warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    build_voc(images, labels, lists, str(tmp_path / 'out'), OPTIONS)
  assert [str(x.message) for x in w] == []
  big = os.path.join(images, 'img_01.png')
  assert ('%s is 28x20 (0 megapixels): predicting it whole (eval, vis) '
          'needs several GB' % big) in caplog.text
  assert 'carry an EXIF orientation' not in caplog.text


def test_unreadable_image_is_named_without_pillows_buffer(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(14, 2)})
  with open(os.path.join(images, 'img_01.png'), 'wb') as f:
    f.write(b'\x89PNG cut short')
  with pytest.raises(build.DataError) as error:
    build_voc(images, labels, lists, str(tmp_path / 'o'), OPTIONS,
              image_format='png')
  assert str(error.value) == ('%s is not a readable image (cannot identify '
                              'image file)' % os.path.join(images, 'img_01.png'))


def test_missing_listed_files_are_listed(tmp_path):
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(13, 2)})
  os.remove(os.path.join(images, 'img_01.png'))
  with pytest.raises(build.DataError, match=r'1 listed file\(s\) missing: '
                                            r'\S*img_01.png'):
    build_voc(images, labels, lists, str(tmp_path / 'o'), OPTIONS,
                    image_format='png')


def test_generic_layout_matches_by_stem(tmp_path, caplog):
  rng = np.random.RandomState(0)
  img_dir, mask_dir = tmp_path / 'images', tmp_path / 'masks'
  img_dir.mkdir()
  mask_dir.mkdir()
  want = {}
  for stem, ext in (('b', 'png'), ('a', 'jpg'), ('c', 'JPEG')):
    ids = common.blocky_label(rng, 18, 22, 4, 3)
    Image.fromarray(common.random_image(rng, 18, 22)).save(
        str(img_dir / ('%s.%s' % (stem, ext))),
        format='PNG' if ext == 'png' else 'JPEG')
    common.save_label(str(mask_dir / (stem + '.png')), ids)
    want[stem] = ids
  out = str(tmp_path / 'out')
  info = build.build_generic(str(img_dir), str(mask_dir), 'train', out,
                             OPTIONS)
  assert info.splits_to_sizes == {'train': 3}
  records = all_records(out, 'train', 2)
  names = [r[0]['image/filename'].bytes_list.value[0].decode()
           for r in records]
  assert names == ['a', 'b', 'c']
  for name, (_, _, ids) in zip(names, records):
    np.testing.assert_array_equal(ids, want[name])

  # Files that are not .jpg/.jpeg/.png images, and masks without an
  # image, were left out without a word.
  Image.fromarray(common.random_image(rng, 18, 22)).save(
      str(img_dir / 'd.bmp'))
  common.save_label(str(mask_dir / 'd.png'), want['a'])
  common.save_label(str(mask_dir / 'e.png'), want['a'])
  with caplog.at_level('WARNING'):
    info = build.build_generic(str(img_dir), str(mask_dir), 'train', out,
                               OPTIONS)
  assert info.splits_to_sizes == {'train': 3}
  assert ('%s: 1 file(s) skipped, not .jpg/.jpeg/.png images: d.bmp; '
          'convert them to JPEG or PNG to train on them' % img_dir
         ) in caplog.text
  assert ('%s: 2 mask(s) have no image in %s, and are skipped: d.png, e.png'
          % (mask_dir, img_dir)) in caplog.text

  os.remove(str(mask_dir / 'b.png'))
  with pytest.raises(build.DataError, match=r'1 image\(s\) .* have no '
                                            r'<stem>.png mask .*: b.png$'):
    build.build_generic(str(img_dir), str(mask_dir), 'val', out, OPTIONS)
  # A mask saved as JPEG is named, with why it is refused.
  (mask_dir / 'b.jpg').write_bytes(b'jpeg')
  with pytest.raises(build.DataError, match=r'<stem>.png mask .*: b.png; '
                     r'found b.jpg instead: masks must be .png files \(a '
                     r"JPEG's compression changes the class ids"):
    build.build_generic(str(img_dir), str(mask_dir), 'val', out, OPTIONS)
  with pytest.raises(ConfigError, match='^split_name is required with '
                                        'masks_folder'):
    build.build_generic(str(img_dir), str(mask_dir), None, out, OPTIONS)


def test_masks_are_found_by_any_case_of_extension_and_unicode_form(
    tmp_path, caplog):
  """b.PNG beside b.jpg was 'no <stem>.png mask ... found b.PNG instead:
  masks must be .png files'; an image named in decomposed Unicode (macOS)
  found no mask named in composed form; images and masks in one folder
  were told to 'keep one' of each pair."""
  rng = np.random.RandomState(3)
  img_dir, mask_dir = tmp_path / 'images', tmp_path / 'masks'
  img_dir.mkdir()
  mask_dir.mkdir()
  composed = 'K\u00fcche'
  want = {}
  for stem, image_name, mask_name in (
      ('a', 'a.JPG', 'a.png'), ('b', 'b.jpg', 'b.PNG'),
      (composed, unicodedata.normalize('NFD', composed) + '.png',
       composed + '.png')):
    ids = common.blocky_label(rng, 18, 22, 4, 3)
    Image.fromarray(common.random_image(rng, 18, 22)).save(
        str(img_dir / image_name),
        format='PNG' if image_name.endswith('png') else 'JPEG')
    common.save_label(str(mask_dir / mask_name), ids)
    want[unicodedata.normalize('NFC', stem)] = ids
  out = str(tmp_path / 'out')
  with caplog.at_level('WARNING'):
    info = build.build_generic(str(img_dir), str(mask_dir), 'train', out,
                               OPTIONS)
  assert info.splits_to_sizes == {'train': 3}
  assert 'have no image' not in caplog.text
  for feature, _, ids in all_records(out, 'train', 2):
    name = unicodedata.normalize(
        'NFC', feature['image/filename'].bytes_list.value[0].decode())
    np.testing.assert_array_equal(ids, want.pop(name))
  assert not want
  with pytest.raises(ConfigError, match=(
      'image_folder and masks_folder are the same folder, %s: its .png '
      'masks would be read as images too' % img_dir)):
    build.build_generic(str(img_dir), str(img_dir), 'train', out, OPTIONS)
  # The VOC layout finds a listed id's image saved as .JPG.
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(4, 1)})
  for f in os.listdir(images):
    stem = os.path.splitext(f)[0]
    Image.open(os.path.join(images, f)).convert('RGB').save(
        os.path.join(images, stem + '.JPG'), format='JPEG')
    os.remove(os.path.join(images, f))
  info = build.build_voc(images, labels, lists, str(tmp_path / 'voc_out'),
                         OPTIONS, image_format='jpg')
  assert info.splits_to_sizes == {'train': 1}


def test_flags_another_layout_reads_and_bad_split_names_are_refused(
    tmp_path):
  """--list_folder beside --masks_folder was ignored: every image of the
  folder went into the split, the val images into train. --split_name=../x
  wrote its records outside --output_dir and reported 'ok'."""
  (tmp_path / 'images').mkdir()
  (tmp_path / 'masks').mkdir()
  generic = ['--image_folder=images', '--masks_folder=masks',
             '--output_dir=out', '--num_classes=4']
  cases = [
      (generic + ['--split_name=val', '--list_folder=lists'],
       '--list_folder is not read in the layout --masks_folder selects: to '
       'convert only the images a <split>.txt list names, give the masks as '
       '--semantic_segmentation_folder (the VOC layout) in place of '
       '--masks_folder'),
      (generic + ['--split_name=val', '--image_format=png'],
       '--image_format is not read in the layout --masks_folder selects'),
      (['--cityscapes_root=.', '--image_folder=images', '--output_dir=out'],
       '--image_folder is not read in the layout --cityscapes_root selects: '
       'the images and labels are read under the root'),
      (generic + ['--split_name=../escaped'],
       '--split_name=../escaped: a split name starts the names of its files'),
      (generic + ['--split_name=train*'], '--split_name=train*: a split'),
  ]
  for args, message in cases:
    result = _cli(args, str(tmp_path))
    assert result.returncode == 2, (args, result.stderr)
    assert result.stderr.splitlines()[-1].startswith(
        'deeplab-build-data: error: ' + message), result.stderr
  assert sorted(os.listdir(tmp_path)) == ['images', 'masks']
  # The library refuses such a name too (a VOC list named so).
  with pytest.raises(ConfigError, match="cannot write split '../x'"):
    build.convert({'../x': []}, str(tmp_path / 'out'), OPTIONS)


def test_bad_options_name_the_field():
  # The library names fields; deeplab-build-data shows them as its flags
  # (test_cli_errors_name_the_flags).
  with pytest.raises(ConfigError, match='^num_classes must be in 1..256'):
    build.BuildOptions(num_classes=300).validate()
  with pytest.raises(ConfigError, match='^class_names has 2 names but '
                                        'num_classes=3') as err:
    build.BuildOptions(num_classes=3, class_names=('a', 'b')).validate()
  assert err.value.fields == ('BuildOptions.class_names',
                              'BuildOptions.num_classes')
  with pytest.raises(ConfigError, match='^colormap=nope'):
    build.BuildOptions(colormap='nope').validate()
  # eval_result.json keeps results by class name: one of the two was lost.
  with pytest.raises(ConfigError, match='^class_names names car more than '
                                        'once'):
    build.BuildOptions(num_classes=3,
                       class_names=('car', 'bike', 'car')).validate()
  with pytest.raises(ConfigError, match='names car more than once'):
    datasets.DatasetInfo(name='d', num_classes=2, ignore_label=255,
                         splits_to_sizes={},
                         class_names=('car', 'car')).validate()


def test_error_values_are_never_read_as_field_references(tmp_path):
  folder = str(tmp_path / '{BuildOptions.num_classes}%s')
  with pytest.raises(ConfigError) as err:
    build.build_generic(folder, folder, 'train', str(tmp_path), OPTIONS)
  assert str(err.value) == 'image_folder=%s is not a folder' % folder
  assert err.value.render(lambda f: '<%s>' % f) == (
      '<build_generic.image_folder>=%s is not a folder' % folder)


def _cli(args, cwd):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  return subprocess.run(
      [sys.executable, '-m', 'deeplab_train.cli.build_data'] + args,
      cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_exits_non_zero_with_one_clear_line(tmp_path):
  pairs = common.tiny_pairs(14, 2)
  pairs[0][2][0, 0] = 30
  images, labels, lists = voc(tmp_path, {'train': pairs})
  result = _cli(['--image_folder', images, '--semantic_segmentation_folder',
                 labels, '--list_folder', lists, '--image_format', 'png',
                 '--output_dir', str(tmp_path / 'out'), '--num_classes', '4'],
                str(tmp_path))
  assert result.returncode == 2
  assert 'Traceback' not in result.stderr
  error_lines = [l for l in result.stderr.splitlines()
                 if l.startswith('deeplab-build-data: error:')]
  assert len(error_lines) == 1
  assert 'img_00.png: label values 30 are outside [0, 4)' in error_lines[0]
  assert error_lines[0].endswith('set --num_classes / --ignore_label')


def test_cli_on_a_full_disk_says_so_in_one_line(tmp_path, monkeypatch,
                                                capsys):
  """TensorFlow's record writer fails (as on a full disk, where it raises
  ResourceExhaustedError): the command names the folder and says the old
  records are kept, on one line, without a traceback."""
  from deeplab_train.cli import build_data as build_cli  # pylint: disable=g-import-not-at-top
  images, labels, lists = voc(tmp_path, {'train': common.tiny_pairs(15, 2)})
  out = tmp_path / 'out'

  class FullDisk(tf.io.TFRecordWriter):

    def write(self, record):
      raise tf.errors.ResourceExhaustedError(
          None, None, '%s; No space left on device' % out)
  monkeypatch.setattr(tf.io, 'TFRecordWriter', FullDisk)
  code = tt.main_in_process('deeplab-build-data', build_cli.main, [
      '--image_folder', images, '--semantic_segmentation_folder', labels,
      '--list_folder', lists, '--image_format', 'png', '--output_dir',
      str(out), '--num_classes', '4'])[0]
  err = capsys.readouterr().err
  # Exit 1: not bad input, and not a bug either.
  assert code == 1
  assert 'Traceback' not in err
  assert ('deeplab-build-data: error: cannot write %s: %s; No space left on '
          'device; the records and dataset.json already there are unchanged'
          % (out, out)) in err.splitlines()
  assert os.listdir(out) == []


def test_cli_errors_name_the_flags(tmp_path):
  # build_voc's label_folder is set by --semantic_segmentation_folder.
  missing = str(tmp_path / 'missing')
  result = _cli(['--semantic_segmentation_folder', missing,
                 '--image_folder', str(tmp_path),
                 '--output_dir', str(tmp_path / 'out')], str(tmp_path))
  assert result.returncode == 2
  message = '--semantic_segmentation_folder=%s is not a folder' % missing
  assert result.stderr.splitlines()[-1] == (
      'deeplab-build-data: error: ' + message)
  assert json.loads(result.stdout.splitlines()[-1])['message'] == message


def test_sample_data_is_what_the_script_makes(tmp_path, repo_dir):
  data = repo_dir / 'data'
  subprocess.run([sys.executable, str(repo_dir / 'scripts' /
                                      'make_sample_data.py'),
                  '--output_dir', str(tmp_path)], check=True,
                 capture_output=True, timeout=120)
  for split, count in (('train', 100), ('val', 30)):
    listed = (data / 'ImageSets' / 'Segmentation' / (split + '.txt')
              ).read_text().split()
    assert len(listed) == count
    assert listed == (tmp_path / 'ImageSets' / 'Segmentation' /
                      (split + '.txt')).read_text().split()
  shapes, classes = set(), set()
  for name in sorted(os.listdir(data / 'SegmentationClass')):
    label = Image.open(data / 'SegmentationClass' / name)
    assert label.mode == 'P'
    ids = np.asarray(label)
    np.testing.assert_array_equal(
        ids, np.asarray(Image.open(tmp_path / 'SegmentationClass' / name)))
    image = np.asarray(Image.open(data / 'JPEGImages' /
                                  name.replace('.png', '.jpg')), np.float32)
    regenerated = np.asarray(Image.open(
        tmp_path / 'JPEGImages' / name.replace('.png', '.jpg')), np.float32)
    assert image.shape[:2] == ids.shape
    assert np.abs(image - regenerated).mean() < 1.0  # same up to the codec
    shapes.add(ids.shape)
    classes.update(np.unique(ids).tolist())
  assert classes == {0, 1, 2, 3, 4, 255}
  assert all(120 <= s <= 260 for shape in shapes for s in shape)
  assert sum(h != w for h, w in shapes) > 100
  size = sum(f.stat().st_size for f in data.rglob('*') if f.is_file())
  assert size < 4e6
