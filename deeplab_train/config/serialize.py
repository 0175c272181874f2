"""JSON round trips of the flat frozen option dataclasses."""
import dataclasses
import json
import os

from deeplab_train.config.errors import ConfigError


def read_json_file(path, invalid):
  """The JSON value in the file `path`, or None when there is no such file.

  Args:
    path: the file.
    invalid: the message for a file that cannot be read as JSON, with two
      %s: the path and the reason.

  Raises:
    ConfigError: the file exists but is not JSON.
  """
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ConfigError(invalid, path, e) from None


def tuple_or_none(value, cast=int):
  """A tuple of `cast` values from a list, tuple or single string; None
  stays None (JSON gives lists, flags give strings)."""
  if value is None:
    return None
  if isinstance(value, (str, bytes)):
    value = [value]
  return tuple(cast(v) for v in value)


def set_field(obj, name, value):
  """Sets a field of a frozen dataclass (in __post_init__ only)."""
  object.__setattr__(obj, name, value)


class JsonMixin:
  """to_dict / from_dict / to_json / from_json / replace."""

  def to_dict(self):
    out = {}
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      out[f.name] = list(v) if isinstance(v, tuple) else v
    return out

  @classmethod
  def from_dict(cls, d):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ConfigError('%s: unknown field(s) %s' % (cls.__name__, unknown))
    return cls(**d)

  def to_json(self):
    return json.dumps(self.to_dict(), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text):
    return cls.from_dict(json.loads(text))

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)
