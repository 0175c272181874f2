"""Lists the image/label pairs of a dataset to convert.

Three layouts are read:

* VOC: `image_folder/<id>.<image_format>`, `label_folder/<id>.png` and one
  `list_folder/<split>.txt` of ids per split (the original converter's
  layout).
* generic: an images folder and a masks folder matched by file stem, written
  as one named split.
* Cityscapes: `root/leftImg8bit/<split>/<city>/<stem>_leftImg8bit.png` with
  `root/gtFine/<split>/<city>/<stem>_gtFine_labelTrainIds.png` (what the
  original converter reads), or else `<stem>_gtFine_labelIds.png` as the
  dataset ships, its label ids mapped to the 19 train ids.

Everything is listed and checked (folders, lists, each listed file) before
anything is converted; the missing files of a list are reported together.
"""
import codecs
import collections
import dataclasses
import logging
import os
import unicodedata
from typing import Optional, Tuple

from deeplab_train.config import ConfigError
from deeplab_train.data import build_options
from deeplab_train.data import datasets

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')

_log = logging.getLogger(__name__)


# A Cityscapes root's folders of images and of labels, by split and city.
CITYSCAPES_IMAGE_FOLDER = 'leftImg8bit'
CITYSCAPES_LABEL_FOLDER = 'gtFine'
CITYSCAPES_IMAGE_SUFFIX = '_leftImg8bit.png'
CITYSCAPES_TRAIN_ID_SUFFIX = '_gtFine_labelTrainIds.png'
CITYSCAPES_LABEL_ID_SUFFIX = '_gtFine_labelIds.png'
# The splits the original Cityscapes converter writes.
CITYSCAPES_DEFAULT_SPLITS = ('train', 'val')


@dataclasses.dataclass(frozen=True)
class Entry:
  """One image/label pair to convert.

  `label_map`, if set, gives the class id of each value (0..255) of the
  label file.
  """
  name: str
  image_path: str
  label_path: Optional[str]
  label_map: Optional[Tuple[int, ...]] = None


# Characters a split name cannot hold: it starts the names of its shard
# files, and readers find those with the glob '<split>-*'.
_SPLIT_NAME_BAD = '/\\*?[]'


def split_name_problem(name):
  """Why `name` cannot name a split (None: it can)."""
  if not name or name.startswith('.') or any(c in _SPLIT_NAME_BAD
                                              for c in name):
    return ('a split name starts the names of its files (<split>-00000-of-'
            '00004.tfrecord) and of its list (<split>.txt): it cannot be '
            'empty, start with "." or hold any of / \\ * ? [ ]')
  return None


def require_dir(path, field):
  """Raises ConfigError unless `path` is a folder.

  Args:
    path: the folder given.
    field: the '{owner.field}' reference of the option that gave it.
  """
  if not path or not os.path.isdir(path):
    raise ConfigError(field + '=%s is not a folder', path)


def voc_split_files(list_folder, split_name=None):
  """{split: list file} for the `<split>.txt` files of a VOC list folder.

  Args:
    list_folder: folder of `<split>.txt` id lists.
    split_name: convert only this split (None: every list).

  Raises:
    ConfigError: no lists, or the named split has no list.
  """
  require_dir(list_folder, '{build_voc.list_folder}')
  found = {os.path.splitext(f)[0]: os.path.join(list_folder, f)
           for f in sorted(os.listdir(list_folder)) if f.endswith('.txt')}
  if split_name:
    if split_name not in found:
      raise ConfigError(
          '{build_voc.split_name}=%s: no %s.txt in {build_voc.list_folder}=%s '
          '(found: %s)', split_name, split_name, list_folder,
          build_options.few(sorted(found)) or 'none')
    return {split_name: found[split_name]}
  if not found:
    raise ConfigError(
        '{build_voc.list_folder}=%s holds no <split>.txt id lists',
        list_folder)
  return found


def voc_entries(list_file, image_folder, label_folder, image_format='jpg',
                label_format='png'):
  """The entries named by one VOC id list.

  Raises:
    ConfigError: empty list.
    DataError: ids whose image or label file is missing.
  """
  ids = _read_ids(list_file)
  if not ids:
    raise ConfigError('%s lists no images', list_file)
  entries, missing = [], []
  for name in ids:
    image = _listed_file(image_folder, name, image_format)
    label = _listed_file(label_folder, name, label_format)
    missing.extend(p for p in (image, label) if not os.path.isfile(p))
    entries.append(Entry(name, image, label))
  if missing:
    raise build_options.DataError(
        '%s: %d listed file(s) missing: %s (check {build_voc.image_folder}, '
        '{build_voc.label_folder} and {build_voc.image_format})',
        list_file, len(missing), build_options.few(missing))
  return entries


def _listed_file(folder, name, extension):
  """The path of `<name>.<extension>` in `folder`. A name with accents may
  be stored in either Unicode form (macOS writes decomposed names, most
  editors composed ones), and the extension in upper case (cameras write
  .JPG): the file is found under any of these; the plain path when none
  exists."""
  for form in (None, 'NFC', 'NFD'):
    stem = unicodedata.normalize(form, name) if form else name
    for ext in (extension, extension.upper()):
      path = os.path.join(folder, '%s.%s' % (stem, ext))
      if os.path.isfile(path):
        return path
  return os.path.join(folder, '%s.%s' % (name, extension))


def _read_ids(list_file):
  """The ids of a list file, each once, in order of first appearance.

  Raises:
    DataError: a line that is not UTF-8 text (ids are stored as UTF-8).
  """
  with open(list_file, 'rb') as f:
    text = f.read()
  # A byte-order mark (Windows Notepad writes one) is not part of the first
  # id, which it made a file name that seemed to exist and did not.
  lines = text[len(codecs.BOM_UTF8):].splitlines() if text.startswith(
      codecs.BOM_UTF8) else text.splitlines()
  ids = []
  for number, line in enumerate(lines, 1):
    try:
      name = line.decode('utf-8').strip()
    except UnicodeDecodeError:
      raise build_options.DataError(
          '%s line %d is not UTF-8 text (%r); save the list as UTF-8 and '
          'give the image and label files UTF-8 names', list_file, number,
          line) from None
    if name:
      ids.append(name)
  repeated = [name for name, n in collections.Counter(ids).items() if n > 1]
  if repeated:
    _log.warning('%s lists %d id(s) more than once (%s); each is converted '
                 'once', list_file, len(repeated),
                 build_options.few(repeated))
  return list(dict.fromkeys(ids))


def _utf8_file_name(folder, name):
  """`name` (from os.listdir) if it is UTF-8, else a DataError naming it."""
  try:
    name.encode('utf-8')
  except UnicodeEncodeError:
    raise build_options.DataError(
        '%s: the file name %s is not UTF-8 (names are stored as UTF-8); '
        'rename it', folder, ascii(name)) from None
  return name


GENERIC_FIELDS = ('{build_generic.image_folder}',
                  '{build_generic.masks_folder}')


def paired_fields(split):
  """The '{owner.field}' references of `split`'s image and label folders
  when each split has its own pair (`build.build_paired_splits`)."""
  return ('{build_paired_splits.%s_image_folder}' % split,
          '{build_paired_splits.%s_image_label_folder}' % split)


def generic_entries(image_folder, masks_folder, label_format='png',
                    fields=GENERIC_FIELDS):
  """Images paired with `<stem>.<label_format>` masks, sorted by stem.

  Args:
    fields: the '{owner.field}' references of the option that gave each
      folder, for messages.

  Raises:
    ConfigError: a folder is missing.
    DataError: no images, an ambiguous stem, or images without a mask.
  """
  image_field, masks_field = fields
  require_dir(image_folder, image_field)
  require_dir(masks_folder, masks_field)
  if os.path.realpath(image_folder) == os.path.realpath(masks_folder):
    raise ConfigError(
        image_field + ' and ' + masks_field + ' are the same folder, %s: its '
        '.png masks would be read as images too; move the masks to a folder '
        'of their own', image_folder)
  images, skipped = {}, []
  for f in sorted(os.listdir(image_folder)):
    stem, ext = os.path.splitext(f)
    if f.startswith('.') or not os.path.isfile(os.path.join(image_folder,
                                                            f)):
      continue
    if ext.lower() not in IMAGE_EXTENSIONS:
      skipped.append(f)
      continue
    _utf8_file_name(image_folder, f)
    if stem in images:
      raise build_options.DataError(
          '%s: two images named %r (%s and %s); keep one', image_folder, stem,
          os.path.basename(images[stem]), f)
    images[stem] = os.path.join(image_folder, f)
  if not images:
    raise build_options.DataError(
        image_field + '=%s holds no .jpg/.jpeg/.png images',
        image_folder)
  masks = _masks_by_stem(masks_folder, label_format)
  entries, unmatched = [], []
  for stem in sorted(images):
    mask = masks.pop(_same_name(stem), None)
    if mask is not None:
      entries.append(Entry(stem, images[stem], mask))
    else:
      unmatched.append(os.path.basename(images[stem]))
  if unmatched:
    stems = {os.path.splitext(f)[0] for f in unmatched}
    # Masks saved in another format (a JPEG's compression changes the ids).
    others = sorted(f for f in os.listdir(masks_folder)
                    if os.path.splitext(f)[0] in stems)
    found = ('; found %s instead: masks must be .%s files (a JPEG\'s '
             'compression changes the class ids at every edge)'
             % (build_options.few(others), label_format) if others else '')
    raise build_options.DataError(
        '%d image(s) in %s have no <stem>.%s mask in %s: %s%s',
        len(unmatched), image_folder, label_format, masks_folder,
        build_options.few(unmatched), found)
  if skipped:
    _log.warning('%s: %d file(s) skipped, not .jpg/.jpeg/.png images: %s; '
                 'convert them to JPEG or PNG to train on them', image_folder,
                 len(skipped), build_options.few(skipped))
  orphans = sorted(os.path.basename(path) for path in masks.values())
  if orphans:
    _log.warning('%s: %d mask(s) have no image in %s, and are skipped: %s',
                 masks_folder, len(orphans), image_folder,
                 build_options.few(orphans))
  return entries


def _same_name(stem):
  """The key under which two spellings of one file name meet: one Unicode
  form (macOS writes decomposed names, most editors composed ones)."""
  return unicodedata.normalize('NFC', stem)


def _masks_by_stem(masks_folder, label_format):
  """{_same_name(stem): path} of the `.<label_format>` files of
  `masks_folder`, the extension in any case (b.PNG)."""
  masks = {}
  for f in sorted(os.listdir(masks_folder)):
    stem, ext = os.path.splitext(f)
    if (ext.lower() == '.' + label_format and not f.startswith('.')
        and os.path.isfile(os.path.join(masks_folder, f))):
      masks.setdefault(_same_name(stem), os.path.join(masks_folder, f))
  return masks


def cityscapes_splits(root, split_name=None):
  """The splits of a Cityscapes root to convert: `split_name`, else those
  of train and val (the original converter's) that are there.

  Raises:
    ConfigError: no such root or leftImg8bit folder, or no such split.
  """
  require_dir(root, '{build_cityscapes.root}')
  images = os.path.join(root, CITYSCAPES_IMAGE_FOLDER)
  if not os.path.isdir(images):
    raise ConfigError(
        '{build_cityscapes.root}=%s has no leftImg8bit folder; give the '
        'folder that holds leftImg8bit/ and gtFine/', root)
  found = sorted(d for d in os.listdir(images)
                 if os.path.isdir(os.path.join(images, d)))
  if split_name:
    if split_name not in found:
      raise ConfigError(
          '{build_cityscapes.split_name}=%s: no %s folder (found: %s)',
          split_name, os.path.join(images, split_name),
          build_options.few(found) or 'none')
    return [split_name]
  splits = [s for s in CITYSCAPES_DEFAULT_SPLITS if s in found]
  if not splits:
    raise ConfigError(
        '%s holds no train or val folder (found: %s); name the split to '
        'convert with {build_cityscapes.split_name}', images,
        build_options.few(found) or 'none')
  return splits


def cityscapes_entries(root, split):
  """The images of one Cityscapes split, each with its gtFine label
  (train ids if that file is there, else label ids mapped to train ids),
  sorted by city and stem; named by stem as the original converter does.

  Raises:
    DataError: no images, or images without a label.
  """
  image_dir = os.path.join(root, CITYSCAPES_IMAGE_FOLDER, split)
  label_dir = os.path.join(root, CITYSCAPES_LABEL_FOLDER, split)
  entries, unlabelled = [], []
  for city in sorted(os.listdir(image_dir)):
    city_dir = os.path.join(image_dir, city)
    if not os.path.isdir(city_dir):
      continue
    for f in sorted(os.listdir(city_dir)):
      if not f.endswith(CITYSCAPES_IMAGE_SUFFIX) or f.startswith('.'):
        continue
      _utf8_file_name(city_dir, f)
      stem = f[:-len(CITYSCAPES_IMAGE_SUFFIX)]
      image = os.path.join(city_dir, f)
      labels = os.path.join(label_dir, city, stem)
      if os.path.isfile(labels + CITYSCAPES_TRAIN_ID_SUFFIX):
        entries.append(Entry(stem, image,
                             labels + CITYSCAPES_TRAIN_ID_SUFFIX))
      elif os.path.isfile(labels + CITYSCAPES_LABEL_ID_SUFFIX):
        entries.append(Entry(stem, image, labels + CITYSCAPES_LABEL_ID_SUFFIX,
                             datasets.CITYSCAPES_LABEL_ID_TO_TRAIN_ID))
      else:
        unlabelled.append(os.path.join(city, f))
  if unlabelled:
    raise build_options.DataError(
        '%d image(s) in %s have no %s or %s label in %s: %s',
        len(unlabelled), image_dir, '<stem>' + CITYSCAPES_TRAIN_ID_SUFFIX,
        CITYSCAPES_LABEL_ID_SUFFIX, label_dir, build_options.few(unlabelled))
  if not entries:
    raise build_options.DataError(
        '%s holds no <city>/*%s images', image_dir, CITYSCAPES_IMAGE_SUFFIX)
  return entries
