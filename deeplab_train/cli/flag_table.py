"""Flags written as tables: one row per flag, defined by `define`.

A row is (kind, name, default, help) or (kind, name, default, help, extra):
kind picks absl's flags.DEFINE_<kind> ('string', 'integer', 'float',
'boolean', 'enum', 'list', 'multi_integer', ...) and extra holds that
function's keyword arguments ({'enum_values': [...]} for an enum,
{'allow_override': True}, {'lower_bound': 0}, ...).

'multi_integer' and 'multi_float' flags also take comma lists: absl reads
--atrous_rates=6,12,18 as one number and fails; here it is the same as
--atrous_rates=6 --atrous_rates=12 --atrous_rates=18.

The flags belong to the module that calls `define`, exactly as if it had
called flags.DEFINE_<kind> itself: --help lists them under that command and
FLAGS.find_module_defining_flag names it.
"""
from absl import flags

# Flags defined from here are attributed to the caller of define().
flags.disclaim_key_flags()


class _CommaMultiFlag(flags.MultiFlag):
  """A multi flag of which each value given may be a comma list."""

  def _parse(self, arguments):
    if isinstance(arguments, str):
      arguments = [arguments]
    if isinstance(arguments, (list, tuple)):
      arguments = [part for argument in arguments
                   for part in (argument.split(',')
                                if isinstance(argument, str) else [argument])]
    return super()._parse(arguments)


def define_comma_multi(parser, name, default, help, **extra):  # pylint: disable=redefined-builtin
  """Defines a multi flag of `parser` values, each given as many times as
  wanted and each time as one value or a comma list."""
  flags.DEFINE_flag(_CommaMultiFlag(parser, flags.ArgumentSerializer(), name,
                                    default, help, **extra))


def _define_comma_multi(parser_class):
  return lambda name, default, help, **extra: define_comma_multi(  # pylint: disable=redefined-builtin
      parser_class(), name, default, help, **extra)


_DEFINE = {'multi_integer': _define_comma_multi(flags.IntegerParser),
           'multi_float': _define_comma_multi(flags.FloatParser)}


def define(*tables):
  """Defines the flags of each table, rows in order.

  Args:
    *tables: tuples of rows (see the module docstring).

  Raises:
    AttributeError: a row's kind is not an absl flags.DEFINE_<kind>.
  """
  for table in tables:
    for row in table:
      kind, name, default, help_text = row[:4]
      extra = row[4] if len(row) > 4 else {}
      define_flag = _DEFINE.get(kind) or getattr(flags, 'DEFINE_' + kind)
      define_flag(name, default, help=help_text, **extra)
