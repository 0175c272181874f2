"""Errors about bad options, written around option fields.

A message names an option as `{owner.field}`: the option dataclass (or the
function) that takes it and the field's name, e.g.
'{TrainOptions.num_clones} must be >= 1'. The library shows such a reference
by its field name ('num_clones must be >= 1'); each command shows it by the
flag that sets it (cli/app.py), so the library never speaks in flags while
the command line keeps the original DeepLab's flag names.
"""
import dataclasses
import math
import re

# {owner.field}: an identifier, a dot, an identifier, in braces.
_FIELD_REF = re.compile(r'\{([A-Za-z_]\w*)\.([A-Za-z_]\w*)\}')


def field_name(qualified):
  """'TrainOptions.num_clones' -> 'num_clones' (how the library shows it)."""
  return qualified.rpartition('.')[2]


def render(text, name_of=field_name):
  """`text` with every {owner.field} replaced by name_of('owner.field')."""
  return _FIELD_REF.sub(lambda m: name_of('%s.%s' % m.groups()), text)


def fields_in(text):
  """The 'owner.field' references of `text`, in order of appearance."""
  return tuple('%s.%s' % m.groups() for m in _FIELD_REF.finditer(text))


class Message:
  """A message naming option fields, rendered when shown (e.g. a result's
  message, which a command shows in terms of its flags)."""

  def __init__(self, template, *values):
    self.template = template
    self.values = values

  def render(self, name_of=field_name):
    """The message with each field shown as name_of('owner.field')."""
    text = render(self.template, name_of)
    return text % self.values if self.values else text

  def __str__(self):
    return self.render()


class ConfigError(ValueError):
  """Bad user input: says what was wrong with which option or file.

  ConfigError(message) takes a finished message; ConfigError(template,
  *values) fills the template's %-specs after its references are rendered,
  so values read from the user (paths, names) are never taken for
  references.

  Attributes:
    template: the message with its {owner.field} references.
    values: what fills the template's %-specs (none: a finished message).
    fields: the referenced fields ('owner.field'), in order.
  """

  def __init__(self, message, *values):
    self.values = values
    super().__init__(message % values if values else message)
    self.template = message

  @property
  def fields(self):
    return fields_in(self.template)

  def render(self, name_of=field_name):
    """The message with each field shown as name_of('owner.field')."""
    text = render(self.template, name_of)
    return text % self.values if self.values else text

  def __str__(self):
    return self.render()


def shortened(items, limit):
  """The first `limit` items comma-separated, and how many in all when cut
  ('a, b, ... (7 in all)'): long lists in messages."""
  items = list(items)
  shown = ', '.join(items[:limit])
  if len(items) > limit:
    shown += ', ... (%d in all)' % len(items)
  return shown


def field_ref(options, name):
  """'{Owner.name}' for a field of the option object `options`."""
  return '{%s.%s}' % (type(options).__name__, name)


def is_crop(crop):
  """None, or (height, width) with positive values."""
  return crop is None or (len(crop) == 2 and min(crop) >= 1)


def check(ok, message):
  """Raises ConfigError(message) unless `ok`: the validation of every
  option class."""
  if not ok:
    raise ConfigError(message)


def check_finite(options):
  """Raises ConfigError naming the first float field of the option
  dataclass `options` (or float in a tuple field) that is infinite or NaN:
  such a value passed the range checks, then trained or predicted nothing
  (an infinite --decay_steps made the learning rate NaN from the first
  step), and NaN failed them with an odd message."""
  for field in dataclasses.fields(options):
    value = getattr(options, field.name)
    for number in value if isinstance(value, tuple) else (value,):
      check(not isinstance(number, float) or math.isfinite(number),
            '%s must be a finite number, got %s'
            % (field_ref(options, field.name), number))


def check_one_of(field, value, allowed):
  """`value` of the option `field` ('{owner.name}') is one of `allowed`."""
  check(value in allowed, '%s must be one of %s, got %r'
        % (field, '/'.join(allowed), value))
