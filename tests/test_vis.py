"""deeplab-vis: PNGs named after the images, at their size, in the palette."""
import json
import os
import re
import signal
import warnings

import numpy as np
from PIL import Image
import pytest

import eval_testing as et
from deeplab_train import config
from deeplab_train.cli import signals
from deeplab_train.cli import vis as vis_cli
from deeplab_train.data import colormap
from deeplab_train.data import datasets
from deeplab_train.evaluation import legend
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.evaluation import vis


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('tiny_vis'))
  data = et.write_tiny_dataset(root)
  train = os.path.join(root, 'train')
  return {'data': data, 'train': train,
          'checkpoint': et.write_checkpoint(train, et.tiny_model_options())}


def _predict(checkpoint, images):
  with predictor_lib.Predictor(et.tiny_model_options(),
                               config.InferenceOptions()) as predictor:
    predictor.restore(checkpoint)
    return predictor.predict([im.astype(np.float32) for im in images])


def test_split_pngs_with_raw_and_overlay(tiny, tmp_path, capsys):
  out = str(tmp_path / 'vis')
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=' + out,
                              '--also_save_raw_predictions', '--save_overlay'])
  assert code == 0
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert line['num_images'] == 4 and line['status'] == 'ok'
  pairs = et.tiny_images()
  want = _predict(tiny['checkpoint'], [image for _, image, _ in pairs])
  pascal = colormap.get_colormap('pascal')  # the tiny dataset's palette
  for (name, image, _), labels in zip(pairs, want):
    h, w = image.shape[:2]
    raw = et.read_png(os.path.join(out, vis.RAW_FOLDER, name + '.png'))
    np.testing.assert_array_equal(raw, labels)
    colored = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                       name + '_prediction.png'))
    assert colored.shape == (h, w, 3)
    np.testing.assert_array_equal(colored, pascal[labels])
    shown = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                     name + '_image.png'))
    np.testing.assert_array_equal(shown, image)
    side = et.read_png(os.path.join(out, vis.OVERLAY_FOLDER,
                                    name + '_overlay.png'))
    assert side.shape == (h, 3 * w, 3)
    np.testing.assert_array_equal(side[:, w:2 * w], colored)
  # Atomic writes leave no temp files.
  assert not [f for _, _, files in os.walk(out) for f in files
              if f.startswith('.')]


def test_cityscapes_raw_predictions_are_label_ids(tiny, tmp_path, capsys):
  """A Cityscapes split: the raw PNGs hold the label ids of the predicted
  train ids (0, 1, 2 -> road 7, sidewalk 8, building 11), as the
  evaluation server reads them; the coloured PNGs keep the train ids."""
  data = et.write_tiny_dataset(str(tmp_path / 'data'),
                               dataset_name='cityscapes')
  out = str(tmp_path / 'vis')
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + data, '--vis_logdir=' + out,
                              '--also_save_raw_predictions'])
  assert code == 0
  capsys.readouterr()
  pairs = et.tiny_images()
  want = _predict(tiny['checkpoint'], [image for _, image, _ in pairs])
  pascal = colormap.get_colormap('pascal')  # the tiny dataset's palette
  seen = set()
  for (name, _, _), labels in zip(pairs, want):
    raw = et.read_png(os.path.join(out, vis.RAW_FOLDER, name + '.png'))
    np.testing.assert_array_equal(raw, np.array([7, 8, 11])[labels])
    colored = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                       name + '_prediction.png'))
    np.testing.assert_array_equal(colored, pascal[labels])
    seen.update(np.unique(raw).tolist())
  assert seen == {7, 8, 11}


def test_raw_ids_past_the_cityscapes_table_are_kept():
  """A dataset named cityscapes with more than its 19 train ids (a
  relabelled one): the ids past the table are written as they are, as the
  original does (an IndexError ended deeplab-vis with a traceback)."""
  labels = np.array([[0, 18], [19, 150]], np.int64)
  np.testing.assert_array_equal(
      vis.mapped_ids(labels, datasets.CITYSCAPES_TRAIN_ID_TO_LABEL_ID),
      [[7, 33], [19, 150]])


def test_image_dir_cityscapes_colours_and_limit(tiny, tmp_path, capsys):
  photos = tmp_path / 'photos'
  photos.mkdir()
  pairs = et.tiny_images()
  Image.fromarray(pairs[0][1]).save(photos / 'b_first.png')
  Image.fromarray(pairs[1][1]).save(photos / 'a_second.jpg', quality=95)
  Image.fromarray(pairs[2][1]).save(photos / 'c_third.png')
  (photos / 'notes.txt').write_text('not an image')
  out = str(tmp_path / 'vis')
  # No --dataset_dir: the saved run config says what the model is.
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                              '--image_dir=%s' % photos, '--vis_logdir=' + out,
                              '--colormap_type=cityscapes',
                              '--max_number_of_images=2'])
  assert code == 0
  written = sorted(os.listdir(os.path.join(out, vis.SEMANTIC_FOLDER)))
  assert written == ['a_second_image.png', 'a_second_prediction.png',
                     'b_first_image.png', 'b_first_prediction.png']
  colored = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                     'b_first_prediction.png'))
  labels = _predict(tiny['checkpoint'], [pairs[0][1]])[0]
  np.testing.assert_array_equal(colored,
                                colormap.get_colormap('cityscapes')[labels])
  capsys.readouterr()


def test_a_colormap_with_fewer_colours_than_classes_is_refused_first(
    tiny, tmp_path, capsys, monkeypatch):
  """A 21-class model drawn with --colormap_type=cityscapes (19 colours)
  failed with a traceback (exit 1) at the first image predicting class 19
  or 20, after legend.png and the images before it were written. The tiny
  model has 3 classes, so cityscapes is given 2 colours here."""
  monkeypatch.setitem(colormap.DEFINED_ENTRIES, 'cityscapes', 2)
  out = tmp_path / 'vis'
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=%s' % out, '--vis_legend=file',
                              '--colormap_type=cityscapes'])
  captured = capsys.readouterr()
  assert code == 2, captured.err[-2000:]
  assert ('deeplab-vis: error: --colormap_type=cityscapes colours 2 classes '
          '(ids 0..1), the model predicts 3: choose pascal (256 colours), or '
          'leave the flag out for the dataset\'s own colours') in captured.err
  assert not out.exists()


def test_a_rerun_into_the_same_folder_names_what_an_earlier_run_left(
    tiny, tmp_path, caplog, capsys):
  """A second deeplab-vis into the same --vis_logdir replaced only the PNGs
  it drew: the first run's other images, raw PNGs and overlays (of another
  checkpoint, maybe) stayed beside them without a word."""
  out = tmp_path / 'vis'
  base = ['--checkpoint_dir=' + tiny['checkpoint'],
          '--dataset_dir=' + tiny['data'], '--vis_logdir=%s' % out]
  with caplog.at_level('WARNING'):
    assert et.run_cli(vis_cli, base + ['--max_number_of_images=2',
                                       '--also_save_raw_predictions']) == 0
    assert 'earlier run' not in caplog.text  # a new folder
    assert et.run_cli(vis_cli, base + ['--max_number_of_images=2',
                                       '--also_save_raw_predictions']) == 0
    assert 'earlier run' not in caplog.text  # every file replaced
    assert et.run_cli(vis_cli, base + ['--max_number_of_images=1']) == 0
  capsys.readouterr()
  warned = [r.getMessage() for r in caplog.records
            if 'earlier run' in r.getMessage()]
  assert len(warned) == 1, warned
  # The second image's two PNGs and both raw PNGs.
  assert warned[0].startswith(
      '4 file(s) in %s were left there by an earlier run and not replaced '
      'by this one, e.g. %s/' % (out, vis.RAW_FOLDER)), warned


def test_an_image_stopped_while_drawn_leaves_none_of_its_pngs(
    tiny, tmp_path, monkeypatch, capsys):
  """A SIGTERM while the last image's overlay was written left its image,
  prediction and raw PNGs without it (3 of 5 tries)."""
  drawn = []
  real_overlay = vis.overlay

  def stopped_at_the_second(*args):
    drawn.append(True)
    if len(drawn) == 2:
      raise signals.Stopped(signal.SIGTERM)
    return real_overlay(*args)
  monkeypatch.setattr(vis, 'overlay', stopped_at_the_second)
  out = tmp_path / 'vis'
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=%s' % out, '--save_overlay',
                              '--also_save_raw_predictions'])
  capsys.readouterr()
  assert code == 143
  files = sorted(str(p.relative_to(out)) for p in out.rglob('*')
                 if p.is_file())
  stems = {re.sub(r'(_image|_prediction|_overlay)?\.png$', '',
                  os.path.basename(f)) for f in files}
  assert len(files) == 4 and len(stems) == 1, files  # the first image's


def test_image_dir_beside_dataset_dir_is_named(tiny, tmp_path, caplog):
  """With both, the folder's images are drawn: --vis_split was silently
  not read."""
  photos = tmp_path / 'photos'
  photos.mkdir()
  Image.fromarray(et.tiny_images()[0][1]).save(photos / 'one.png')
  out = tmp_path / 'vis'
  with caplog.at_level('WARNING'):
    assert et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                                '--image_dir=%s' % photos,
                                '--dataset_dir=' + tiny['data'],
                                '--vis_logdir=%s' % out,
                                '--eval_interval_secs=5']) == 0
  assert ('drawing the images of --image_dir=%s; --dataset_dir=%s gives only '
          'the classes and their colours (its split val is not drawn)'
          % (photos, tiny['data'])) in caplog.text
  # The original's vis.py loops with it; this one draws once.
  assert ('--eval_interval_secs=5 ignored: deeplab-vis visualises the latest '
          'checkpoint once') in caplog.text
  assert sorted(os.listdir(out / vis.SEMANTIC_FOLDER)) == [
      'one_image.png', 'one_prediction.png']


def test_image_dir_draws_past_an_unreadable_file_and_other_formats(
    tiny, tmp_path, capsys):
  """One unreadable file stopped the whole folder (exit 2 after the images
  before it), and .webp/.bmp/.tif photos were skipped without a word. Now
  every readable image is drawn, then exit 2 names the unreadable ones."""
  photos = tmp_path / 'photos'
  photos.mkdir()
  image = et.tiny_images()[0][1]
  Image.fromarray(image).save(photos / 'a.webp', lossless=True)
  (photos / 'b.jpg').write_bytes(b'not a picture')
  Image.fromarray(image).save(photos / 'c.bmp')
  Image.fromarray(image).save(photos / 'd.tif')
  out = tmp_path / 'vis'
  assert et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['checkpoint'],
                              '--image_dir=%s' % photos,
                              '--vis_logdir=%s' % out]) == 2
  err = capsys.readouterr().err.splitlines()[-1]
  assert err.startswith(
      'deeplab-vis: error: 1 file(s) of --image_dir could not be read or '
      'drawn and were skipped, after 3 image(s) were drawn to %s: %s (' % (
          out, photos / 'b.jpg'))
  assert err.endswith('); replace or remove them')
  assert sorted(os.listdir(out / vis.SEMANTIC_FOLDER)) == [
      '%s_%s.png' % (stem, kind) for stem in 'acd'
      for kind in ('image', 'prediction')]
  labels = _predict(tiny['checkpoint'], [image])[0]
  for stem in 'acd':
    np.testing.assert_array_equal(
        et.read_png(out / vis.SEMANTIC_FOLDER / ('%s_prediction.png' % stem)),
        colormap.get_colormap('pascal')[labels])


def test_an_image_too_large_for_the_input_is_skipped_like_an_unreadable_one(
    tmp_path):
  """One image larger than a fixed input (--vis_crop_size, an exported
  .tflite) stopped the whole folder: those after it were never drawn."""
  class Fixed:
    def predict(self, images, names):
      for image, name in zip(images, names):
        if image.shape[0] > 10:
          raise config.ImageTooLargeError(
              'image %s is too large for {open_exported.path}=%s', name,
              'm.tflite')
      return [np.zeros(image.shape[:2], np.int64) for image in images]

  def sample(name, size):
    image = np.zeros((size, size, 3), np.uint8)
    return {'image': image.astype(np.float32), 'name': name, 'label': None,
            'height': size, 'width': size, 'original_image': image}
  samples = [sample('a.png', 8), sample('big.png', 20), sample('c.png', 8)]
  skipped = []
  count = vis.visualize(Fixed(), samples, str(tmp_path), 'pascal',
                        config.VisOptions(), batch_size=2, too_large=skipped)
  # In the command's terms: the option shown as its flag (it read
  # 'path=m.tflite').
  from deeplab_train.cli import app  # pylint: disable=g-import-not-at-top
  from deeplab_train.cli import vis as vis_cli  # pylint: disable=g-import-not-at-top
  assert [app.user_message(s, vis_cli.FLAG_NAMES) for s in skipped] == [
      'big.png (image big.png is too large for --exported_model=m.tflite)']
  assert count == 2   # drawn
  assert sorted(os.listdir(tmp_path / vis.SEMANTIC_FOLDER)) == [
      'a_image.png', 'a_prediction.png', 'c_image.png', 'c_prediction.png']
  with pytest.raises(config.ImageTooLargeError):
    vis.visualize(Fixed(), samples, str(tmp_path), 'pascal',
                  config.VisOptions(), batch_size=2)


def test_image_dir_with_resize_keeps_input_size(tiny, tmp_path):
  photos = tmp_path / 'big'
  photos.mkdir()
  image = np.random.RandomState(1).randint(0, 256, (70, 90, 3), np.uint8)
  Image.fromarray(image).save(photos / 'big.png')
  samples = list(vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None,
                                            max_resize_value=41), None))
  # floor(70 * 41 / 90) = 31: what the network sees.
  assert samples[0]['image'].shape == (31, 41, 3)
  with predictor_lib.Predictor(et.tiny_model_options(),
                               config.InferenceOptions()) as predictor:
    predictor.restore(tiny['checkpoint'])
    vis.visualize(predictor, samples, str(tmp_path / 'out'), 'pascal',
                  config.VisOptions(also_save_raw_predictions=True))
  raw = et.read_png(str(tmp_path / 'out' / vis.RAW_FOLDER / 'big.png'))
  assert raw.shape == (70, 90)


def test_image_dir_jpeg_is_decoded_as_training_decodes_it(tmp_path):
  """deeplab-build-data keeps a JPEG's bytes and training decodes them
  with TensorFlow; --image_dir decoded them with Pillow (another DCT),
  pixels up to 12 levels apart, and predictions on 0.1-0.5 % of pixels
  differed from those of the same image in a split."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  photos = tmp_path / 'photos'
  photos.mkdir()
  rng = np.random.RandomState(5)
  pixels = rng.randint(0, 256, (48, 64, 3)).astype(np.uint8)
  Image.fromarray(pixels).save(photos / 'noisy.jpg', quality=90)
  Image.fromarray(pixels[..., 0]).save(photos / 'grey.jpg', quality=90)
  samples = list(vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None), None))
  assert [x['name'] for x in samples] == ['grey.jpg', 'noisy.jpg']
  for sample in samples:
    data = (photos / sample['name']).read_bytes()
    with tf.Graph().as_default(), tf.Session() as sess:
      want = sess.run(tf.io.decode_image(data, channels=3))
    np.testing.assert_array_equal(sample['original_image'], want)
  # Pillow's pixels are not those (else this test would prove nothing).
  pillow = np.asarray(Image.open(photos / 'noisy.jpg').convert('RGB'))
  assert not np.array_equal(pillow, samples[1]['original_image'])
  # A file cut short is named with Pillow's reason, as by the build.
  (photos / 'cut.jpg').write_bytes((photos / 'noisy.jpg').read_bytes()[:400])
  unreadable = []
  assert len(list(vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None), None,
      unreadable))) == 2
  entry, = unreadable
  assert entry.startswith('%s (' % (photos / 'cut.jpg')), entry
  assert 'runcated' in entry and 'Graph execution' not in entry, entry
  # So is a file that cannot be opened at all.
  (photos / 'cut.jpg').unlink()
  (photos / 'folder.jpg').mkdir()
  unreadable = []
  assert len(list(vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None), None,
      unreadable))) == 2
  assert unreadable == ['%s (Is a directory)' % (photos / 'folder.jpg')], (
      unreadable)


def test_image_dir_16_bit_grey_png_is_drawn_scaled(tmp_path):
  photos = tmp_path / 'deep'
  photos.mkdir()
  deep = (np.arange(20 * 30).reshape(20, 30) * 100).astype(np.uint16)
  Image.fromarray(deep).save(photos / 'deep.png')
  sample, = vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None), None)
  want = np.rint(deep / 257.0).astype(np.uint8)
  np.testing.assert_array_equal(sample['original_image'],
                                np.stack([want] * 3, axis=-1))


def test_image_dir_float_tiff_is_drawn_on_its_scale(tmp_path):
  """A 32-bit float TIFF (PIL mode F) of values in [0, 1] was drawn black:
  PIL's convert truncates the floats to integers. One in [0, 1] is scaled
  by 255, one in [0, 255] taken as it is, and one of neither scale (or
  with a NaN) is named as unreadable with the reason."""
  photos = tmp_path / 'float'
  photos.mkdir()
  unit = (np.arange(20 * 30).reshape(20, 30) / (20 * 30 - 1)).astype(
      np.float32)
  # A resampled image overshoots its scale a little: clipped, not taken
  # on the other scale (it came out black).
  over = unit * 1.04 - 0.02
  cases = {'a_unit.tif': (unit, np.rint(unit * 255.0)),
           'b_bytes.tif': (unit * 200.0, np.rint(unit * 200.0)),
           'c_over.tif': (over, np.clip(np.rint(over * 255.0), 0, 255))}
  for name, (values, _) in cases.items():
    Image.fromarray(values, mode='F').save(photos / name)
  Image.fromarray(unit * 1000.0, mode='F').save(photos / 'd_wide.tif')
  nan = unit.copy()
  nan[0, 0] = np.nan
  Image.fromarray(nan, mode='F').save(photos / 'e_nan.tif')
  assert Image.open(photos / 'a_unit.tif').mode == 'F'
  unreadable = []
  samples = list(vis.iterate_image_dir(
      str(photos), config.PreprocessOptions(crop_size=None), None,
      unreadable))
  assert [s['name'] for s in samples] == ['a_unit.tif', 'b_bytes.tif',
                                          'c_over.tif']
  for sample in samples:
    want = cases[sample['name']][1].astype(np.uint8)
    np.testing.assert_array_equal(sample['original_image'],
                                  np.stack([want] * 3, axis=-1))
  assert samples[0]['original_image'].max() == 255   # not black
  assert len(unreadable) == 2
  assert 'd_wide.tif' in unreadable[0]
  assert 'from 0 to 1000' in unreadable[0]
  assert 'e_nan.tif' in unreadable[1] and '1 NaN' in unreadable[1]


def test_image_dir_says_what_it_skips_and_which_photos_are_turned(
    tmp_path, caplog, monkeypatch):
  """A folder of phone photos (.heic beside a few JPEGs, subfolders) drew
  the JPEGs without a word about the rest; photos with an EXIF orientation
  were drawn sideways to how viewers show them, without a word (the build
  warns about them)."""
  photos = tmp_path / 'phone'
  (photos / 'sub').mkdir(parents=True)
  (photos / 'IMG_1.heic').write_bytes(b'not read')
  exif = Image.Exif()
  exif[0x0112] = 6
  Image.fromarray(np.zeros((6, 8, 3), np.uint8)).save(photos / 'IMG_2.jpg',
                                                      exif=exif)
  Image.fromarray(np.zeros((6, 8, 3), np.uint8)).save(photos / 'IMG_3.jpg')
  # Over Pillow's warning limit: its 'could be decompression bomb DOS
  # attack' named no file.
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 40)   # 48 > 40
  with caplog.at_level('WARNING'), warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    samples = list(vis.iterate_image_dir(
        str(photos), config.PreprocessOptions(crop_size=None), None))
  assert [str(x.message) for x in w] == []
  assert ('%s is 8x6 (0 megapixels): predicting it whole'
          % (photos / 'IMG_3.jpg')) in caplog.text
  assert [s['name'] for s in samples] == ['IMG_2.jpg', 'IMG_3.jpg']
  assert ('%s: 2 entries not drawn (only .jpg/.jpeg/.png/.bmp/.webp/.tif/'
          '.tiff files are, not in '
          'subfolders): IMG_1.heic, sub' % photos) in caplog.text
  assert ('1 image(s) carry an EXIF orientation that viewers apply (turned '
          'or mirrored): IMG_2.jpg.') in caplog.text


def test_image_dir_image_over_pillows_pixel_limit_is_named(tmp_path,
                                                          monkeypatch):
  """An orthophoto over Pillow's limit ended vis with a traceback that did
  not name the file, speaking of a 'decompression bomb DOS attack'."""
  photos = tmp_path / 'huge'
  photos.mkdir()
  Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(photos / 'h.png')
  # Refused over 2 x MAX_IMAGE_PIXELS (Pillow's rule): 1200 > 2 x 500.
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 500)
  with pytest.raises(config.ConfigError) as error:
    list(vis.iterate_image_dir(
        str(photos), config.PreprocessOptions(crop_size=None), None))
  assert str(error.value) == (
      'cannot read image %s: Image size (1200 pixels) exceeds limit of '
      '1000 pixels, which Pillow refuses as a possible decompression bomb: '
      'cut it into smaller images' % (photos / 'h.png'))


def test_resize_nearest_matches_tensorflow():
  import tensorflow.compat.v1 as tf
  labels = np.random.RandomState(0).randint(0, 9, (7, 10)).astype(np.int32)
  for size in ((3, 3), (13, 4), (7, 10), (20, 31)):
    with tf.Graph().as_default(), tf.Session() as sess:
      want = sess.run(tf.image.resize_nearest_neighbor(
          labels[None, :, :, None], size, align_corners=True))[0, :, :, 0]
    np.testing.assert_array_equal(vis.resize_nearest(labels, *size), want)
  assert vis.output_stem('dir/x y.JPG') == 'x_y'


def test_every_image_gets_its_own_output_names():
  """a.png was drawn as a_2, then overwritten by a_2.png's outputs; a
  244-byte name's outputs failed with 'File name too long' (exit 1)."""
  unique = vis._UniqueStems()  # pylint: disable=protected-access
  stems = [unique(n) for n in ('a.jpg', 'a.png', 'a_2.png', 'a_2.jpg')]
  assert stems == ['a', 'a_2', 'a_2_2', 'a_2_3']
  long_name = '\u5199\u771f' * 40 + '.jpg'   # 240 bytes of UTF-8 and .jpg
  stem = vis.output_stem(long_name)
  assert len(stem.encode('utf-8')) <= 150 and long_name.startswith(stem)
  # Cut at a character, not inside one.
  assert vis.output_stem('\u00e9' * 200 + '.png') == '\u00e9' * 75


def test_missing_image_dir_is_bad_input(tiny, tmp_path, capsys):
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--image_dir=%s/none' % tmp_path,
                              '--vis_logdir=%s/out' % tmp_path])
  assert code == 2
  assert 'is not a folder' in capsys.readouterr().err


def test_crop_too_small_for_the_split_is_refused_at_once(tiny, tmp_path,
                                                         capsys):
  """As in deeplab-eval: refused before any image is drawn (before, after
  the images that fit), with the size every image of the split fits."""
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_crop_size=33,33',
                              '--vis_logdir=%s/out' % tmp_path])
  err = capsys.readouterr().err
  assert code == 2
  assert ("split 'val' (its largest height and width, from %s) is 41x41 "
          % os.path.join(tiny['data'], 'dataset.json')) in err
  assert '--vis_crop_size=41,41 (or larger)' in err
  assert not os.path.exists('%s/out' % tmp_path)
  # The first images of --max_number_of_images may fit where the split's
  # largest (the last, 41x41) does not: they were refused all the same.
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_crop_size=40,41',
                              '--max_number_of_images=1',
                              '--vis_logdir=%s/first' % tmp_path])
  assert code == 0, capsys.readouterr().err
  assert len(os.listdir('%s/first/%s' % (tmp_path, vis.SEMANTIC_FOLDER))) == 2


def test_legend_on_image_names_the_dataset_classes(tiny, tmp_path, capsys):
  out = str(tmp_path / 'vis')
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=' + out, '--vis_legend=on_image',
                              '--also_save_raw_predictions',
                              '--max_number_of_images=1'])
  assert code == 0
  name, image, _ = et.tiny_images()[0]
  labels = _predict(tiny['checkpoint'], [image])[0]
  colored = colormap.get_colormap('pascal')[labels]
  # Class names from the dataset.json the converter wrote.
  entries = legend.legend_entries(labels, ('bg', 'cat', 'dog'), 'pascal')
  shown = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                   name + '_prediction.png'))
  np.testing.assert_array_equal(shown, legend.with_legend(colored, entries))
  assert shown.shape[1] > image.shape[1]
  raw = et.read_png(os.path.join(out, vis.RAW_FOLDER, name + '.png'))
  np.testing.assert_array_equal(raw, labels)
  assert not os.path.exists(os.path.join(out, vis.LEGEND_FILENAME))
  capsys.readouterr()


def test_legend_file_lists_every_class(tiny, tmp_path, capsys):
  out = str(tmp_path / 'vis')
  code = et.run_cli(vis_cli, ['--checkpoint_dir=' + tiny['train'],
                              '--dataset_dir=' + tiny['data'],
                              '--vis_logdir=' + out, '--vis_legend=file',
                              '--max_number_of_images=1'])
  assert code == 0
  entries = legend.all_class_entries(et.NUM_CLASSES, ('bg', 'cat', 'dog'),
                                     'pascal')
  np.testing.assert_array_equal(
      et.read_png(os.path.join(out, vis.LEGEND_FILENAME)),
      np.asarray(legend.legend_image(entries)))
  name, image, _ = et.tiny_images()[0]
  shown = et.read_png(os.path.join(out, vis.SEMANTIC_FOLDER,
                                   name + '_prediction.png'))
  assert shown.shape == image.shape
  capsys.readouterr()
