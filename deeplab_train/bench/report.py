"""The benchmark's report: a text table with a column per setting."""


def _bf16_peak_fraction(result):
  """achieved / the bf16 matmul peak for a bf16 setting, else None: a bf16
  step is measured against what the machine does in bf16."""
  peak = result.get('peak_bf16_gflops')
  if result['mixed_precision'] != 'bf16' or not peak:
    return None
  return result['achieved_gflops'] / peak


# (label, result key or fn(result) -> value, format)
_TABLE_ROWS = (
    ('input pipeline', 'input_images_per_sec', '%.1f img/s'),
    ('training', 'train_images_per_sec', '%.3f img/s'),
    ('step', 'seconds_per_step', '%.3f s'),
    ('first step', 'first_step_seconds', '%.1f s'),
    ('FLOPs / step', 'gflop_per_step', '%.4g GFLOP'),
    ('achieved', 'achieved_gflops', '%.1f GFLOP/s'),
    ('fp32 matmul peak', 'peak_gflops', '%.1f GFLOP/s'),
    ('bf16 matmul peak', 'peak_bf16_gflops', '%.1f GFLOP/s'),
    ('share of fp32 peak', 'peak_fraction', '%.1%%'),
    ('share of bf16 peak', _bf16_peak_fraction, '%.1%%'),
    ('peak RSS', 'peak_rss_gib', '%.2f GiB'),
    ('input wait / step', 'input_wait_seconds_per_step', '%.4f s'),
    ('input wait share', 'input_wait_fraction', '%.2%%'),
    ('cores used', 'cores_used', '%.2f'),
    ('loss first -> last', None, None),
    ('load average', 'load_average', '%s'),
)


def _format(fmt, value):
  if value is None:
    return '-'
  if fmt.endswith('%%'):
    return (fmt[:-2] + 'f %%') % (100.0 * value)
  return fmt % (value,)


def variant_name(result):
  """'fp32', 'bf16', 'bf16+xla', ... for a result dict; 'auto (bf16)'
  where --bench_variants gave a setting that chose another."""
  fp32 = lambda text: text.replace('none', 'fp32')
  name = fp32(result['mixed_precision']) + ('+xla' if result['use_xla']
                                            else '')
  given = result.get('bench_variant')
  if given is None or fp32(given) in (name, name.replace('fp32+', '')):
    return name
  return '%s (%s)' % (given, name)


def format_table(results):
  """A text table: one column per result, a ratio row against the first.

  Args:
    results: list of result dicts of the same config (settings differ).

  Returns:
    str.
  """
  first = results[0]
  title = ('%s OS%d crop %s batch %d, %d tower(s), fine_tune_batch_norm=%s,'
           ' data %s' % (first['model_variant'], first['output_stride'],
                         'x'.join(map(str, first['crop_size'])),
                         first['batch_size'], first['num_clones'],
                         first['fine_tune_batch_norm'], first['data']))
  rows = [[''] + [variant_name(r) for r in results]]
  for label, key, fmt in _TABLE_ROWS:
    if key is None:
      rows.append([label] + ['%.3f -> %.3f' % (r['first_loss'], r['last_loss'])
                             for r in results])
    else:
      rows.append([label] + [
          _format(fmt, key(r) if callable(key) else r[key]) for r in results])
  if len(results) > 1:
    rows.append(['training vs %s' % variant_name(first)] + [
        '%.2fx' % (r['train_images_per_sec'] / first['train_images_per_sec'])
        for r in results])
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = [title]
  for row in rows:
    lines.append('  '.join(cell.ljust(w) if i == 0 else cell.rjust(w)
                           for i, (cell, w) in enumerate(zip(row, widths))))
  return '\n'.join(lines)


def rounded(value, digits=4):
  """`value` (a result) with every float in it rounded, also inside its
  dicts and lists, for a compact JSON line."""
  if isinstance(value, float):
    return round(value, digits)
  if isinstance(value, dict):
    return {k: rounded(v, digits) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [rounded(v, digits) for v in value]
  return value
