"""The font to draw class names with (legends, the confusion heatmap).

Pillow's default font draws ASCII only: 'Pâté', 'кошка' or '猫' came out
as boxes. `font_for(texts)` is that font when it draws every character of
the texts, else the font fontconfig (`fc-match`) finds best for the ones it
lacks, when that one lacks fewer; characters no font here draws are named
in a warning, once each.
"""
import functools
import logging
import shutil
import subprocess

import numpy as np
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont

# A private-use code point no font draws: what a missing glyph looks like.
_NO_GLYPH = '\U0010fffd'

_log = logging.getLogger(__name__)


def font_for(texts=()):
  """The font for `texts`: Pillow's default, or a system font that draws
  the characters it lacks."""
  chars = frozenset(c for c in set(''.join(texts)) if _default_lacks(c))
  return _font_for(chars) if chars else ImageFont.load_default()


@functools.lru_cache(maxsize=None)
def _default_lacks(char):
  return bool(lacking(ImageFont.load_default(), char))


# The characters a warning named already (once each per process: the
# classes present change from one image's legend to the next).
_warned = set()


@functools.lru_cache(maxsize=None)
def _font_for(chars):
  """The font lacking the fewest of `chars` (which Pillow's default
  lacks): the first of fontconfig's best fonts for them with fewer."""
  font = ImageFont.load_default()
  undrawn = sorted(chars)
  for path in _system_fonts(undrawn):
    try:
      other = ImageFont.truetype(path, font.size)
    except (OSError, ValueError):
      continue
    still = lacking(other, chars)
    if len(still) < len(undrawn):
      font, undrawn = other, still
    if not undrawn:
      break
  news = [c for c in undrawn if c not in _warned]
  if news:
    _warned.update(news)
    _log.warning('no font found here draws %s of the class names: they '
                 'show as boxes in the drawn images (legends, the confusion '
                 'heatmap); install a font that has them (e.g. Noto)',
                 ' '.join(news))
  return font


def lacking(font, chars):
  """The characters of `chars` `font` draws as it draws no glyph, sorted
  (none for a font without FreeType: Pillow's bitmap fallback, whose
  callers keep to Latin-1)."""
  if not isinstance(font, ImageFont.FreeTypeFont):
    return []
  missing = _pixels(font, _NO_GLYPH)
  return sorted(c for c in chars if c == _NO_GLYPH or (
      not c.isspace() and np.array_equal(_pixels(font, c), missing)))


def _pixels(font, char):
  left, top, right, bottom = font.getbbox(char)
  image = Image.new('L', (max(1, right - left), max(1, bottom - top)))
  ImageDraw.Draw(image).text((-left, -top), char, fill=255, font=font)
  return np.asarray(image)


def _system_fonts(chars):
  """Font files fontconfig finds best for `chars` (none without it)."""
  fc_match = shutil.which('fc-match')
  if fc_match is None:
    return []
  charset = ' '.join('%x' % ord(c) for c in chars)
  try:
    found = subprocess.run(
        [fc_match, '--sort', '--format=%{file}\n', ':charset=' + charset],
        capture_output=True, text=True, timeout=10, check=False)
  except (OSError, subprocess.SubprocessError):
    return []
  return [line for line in found.stdout.splitlines() if line][:5]
