"""Flags written as tables: one row per flag, defined by `define`.

A row is (kind, name, default, help) or (kind, name, default, help, extra):
kind picks absl's flags.DEFINE_<kind> ('string', 'integer', 'float',
'boolean', 'enum', 'list', 'multi_integer', ...) and extra holds that
function's keyword arguments ({'enum_values': [...]} for an enum,
{'allow_override': True}, {'lower_bound': 0}, ...).

The flags belong to the module that calls `define`, exactly as if it had
called flags.DEFINE_<kind> itself: --help lists them under that command and
FLAGS.find_module_defining_flag names it.
"""
from absl import flags

# Flags defined from here are attributed to the caller of define().
flags.disclaim_key_flags()


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
      define_flag = getattr(flags, 'DEFINE_' + kind)
      define_flag(name, default, help=help_text, **extra)
