"""JSON round trips of the flat frozen option dataclasses."""
import dataclasses
import json

from deeplab_train.config.errors import ConfigError


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
