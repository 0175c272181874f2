"""Image files read with PIL as 8-bit RGB, deep grey images included.

PIL's own convert('RGB') clips the pixels of 16- and 32-bit grey images
(modes I;16*, I) at 255, so a 16-bit grey PNG comes out all white. Those
are scaled to 8 bits here instead (v / 257, the 16-bit full scale onto the
8-bit one), as TensorFlow's PNG decoder does when asked for uint8. It also
truncates a float image (mode F, e.g. a 32-bit float TIFF) to integers, so
one of values in [0, 1] comes out black; such an image is scaled by 255
here, as TensorFlow's convert_image_dtype does, and one in [0, 255] taken
as it is.

`READ_ERRORS` are what opening a bad file raises, and `read_error_reason`
says why in the user's terms.
"""
import warnings

import numpy as np
from PIL import Image

from deeplab_train.config import errors

# The EXIF tag of the orientation viewers apply to a photo's pixels (1:
# none; 2-8: mirrored and/or rotated; 5-8 swap width and height).
EXIF_ORIENTATION = 0x0112

# Modes of one channel of integers wider than 8 bits (16-bit PNGs open as
# I;16 or, in older Pillow, I).
DEEP_GREY_MODES = ('I', 'I;16', 'I;16B', 'I;16L', 'I;16N')
# What PIL raises for a file it cannot read: a broken or unknown file, or
# one over its pixel limit (DecompressionBombError is not an OSError).
READ_ERRORS = (OSError, ValueError, Image.DecompressionBombError)


def read_error_reason(error):
  """Why PIL could not read a file. Over its pixel limit, PIL speaks of a
  'decompression bomb DOS attack'; the image is just too large, and cutting
  it into tiles is what to do."""
  if isinstance(error, Image.DecompressionBombError):
    return ('%s, which Pillow refuses as a possible decompression bomb: cut '
            'it into smaller images' % str(error).split(', could be')[0])
  return str(error)


def quiet_unnamed_warnings():
  """Silences Pillow's warnings that name no file, for a reader that says
  the same naming it (`large_image_note`): 'could be decompression
  bomb DOS attack' for an image over its pixel warning limit, which is read
  anyway, and 'Corrupt EXIF data' for an EXIF block it cannot parse, whose
  only tag read here (the orientation) is then taken as absent."""
  warnings.filterwarnings('ignore', category=Image.DecompressionBombWarning)
  warnings.filterwarnings('ignore', message='(Possibly c|C)orrupt EXIF',
                          category=UserWarning)


def large_image_note(path, width, height):
  """A warning line for an image over Pillow's pixel warning limit, else
  None."""
  limit = Image.MAX_IMAGE_PIXELS
  if limit is None or width * height <= limit:
    return None
  return ('%s is %dx%d (%.0f megapixels): predicting it whole (eval, vis) '
          'needs several GB of memory; cut it into tiles if that is too '
          'much' % (path, width, height, width * height / 1e6))


def orientation(im):
  """The EXIF orientation of the open image `im`: 1 (as stored) when it
  has none or one outside EXIF's 1..8, which viewers do not apply."""
  value = im.getexif().get(EXIF_ORIENTATION, 1)
  return value if value in range(1, 9) else 1


def turned_note(names, stored_how):
  """The warning for images whose EXIF orientation viewers apply: who
  they are, then `stored_how` (what the command did and what it means)."""
  return ('%d image(s) carry an EXIF orientation that viewers apply (turned '
          'or mirrored): %s. %s: apply the orientation to the files first '
          '(e.g. `exiftran -ai` or `mogrify -auto-orient`)'
          % (len(names), errors.shortened(names, 10), stored_how))


def to_rgb(im):
  """A PIL image as a PIL RGB image of 8 bits per channel.

  Raises:
    ValueError: a float image whose values are neither in [0, 1] nor in
      [0, 255] (no 8-bit scale can be told from it).
  """
  if im.mode in DEEP_GREY_MODES:
    wide = np.asarray(im, dtype=np.int64)
    grey = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
    return Image.fromarray(grey, mode='L').convert('RGB')
  if im.mode == 'F':
    return Image.fromarray(_float_to_8_bits(np.asarray(im)),
                           mode='L').convert('RGB')
  return im.convert('RGB')


# How far past its scale's ends a float image's values may reach (resampled
# images overshoot a little) and still be taken on that scale, clipped:
# this share of the scale's top.
FLOAT_OVERSHOOT = 0.05


def _float_to_8_bits(values):
  """The grey values of a float image as uint8: by 255 when all are in
  [0, 1], as they are in [0, 255], each give or take FLOAT_OVERSHOOT of
  the scale, clipped (an image in [0, 1] whose maximum was 1.02 came out
  almost black, taken as one in [0, 255])."""
  finite = np.isfinite(values)
  if not finite.all():
    raise ValueError('a float image with %d NaN or infinite pixel(s): '
                     'convert it to an 8-bit image'
                     % np.count_nonzero(~finite))
  low, high = (float(values.min()), float(values.max())) if values.size \
      else (0.0, 0.0)
  within = lambda top: (low >= -FLOAT_OVERSHOOT * top
                        and high <= (1 + FLOAT_OVERSHOOT) * top)
  if within(1.0):
    scale = 255.0
  elif within(255.0):
    scale = 1.0
  else:
    raise ValueError('a float image with values from %g to %g, neither in '
                     '[0, 1] nor in [0, 255]: convert it to an 8-bit image '
                     'of the scale meant' % (low, high))
  return np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)
