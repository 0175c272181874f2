"""deeplab-bench --exported_model: every format side by side, bad input."""
import json
import os

import pytest

import eval_testing as et
from deeplab_train import config
from deeplab_train.bench import exported
from deeplab_train.cli import bench as bench_cli
from deeplab_train.cli import export as export_cli
from deeplab_train.export import loaded
from deeplab_train.runtime import cpu as cpu_lib

# tf.lite.Interpreter (used when LiteRT is not installed) warns that it is
# deprecated.
pytestmark = pytest.mark.filterwarnings(
    'ignore:.*tf.lite.Interpreter is deprecated')

LABELS = ('.pb', 'SavedModel', '.tflite float32', '.tflite int8')


@pytest.fixture(scope='module')
def models(tmp_path_factory):
  """{label: path} of a tiny checkpoint exported in each format."""
  root = tmp_path_factory.mktemp('bench_exported')
  data = et.write_tiny_dataset(str(root), split='train')
  train = str(root / 'train')
  et.write_checkpoint(train, et.tiny_model_options())
  out = root / 'export'
  paths = {'.pb': str(out / 'frozen.pb'),
           'SavedModel': str(out / 'saved_model'),
           '.tflite float32': str(out / 'float.tflite'),
           '.tflite int8': str(out / 'int8.tflite')}
  common = ['--checkpoint_path=' + train, '--crop_size=41,41']
  for args in (['--export_path=' + paths['.pb'],
                '--saved_model_dir=' + paths['SavedModel'],
                '--tflite_path=' + paths['.tflite float32']],
               ['--tflite_path=' + paths['.tflite int8'],
                '--tflite_quantize=int8', '--dataset_dir=' + data,
                '--num_calibration_images=2']):
    with et.captured_stdout() as stdout:
      assert et.run_cli(export_cli, common + args) == 0, stdout.getvalue()
  return paths


def _bench(args, capsys):
  """Runs deeplab-bench here (its children in processes of their own);
  returns (exit code, stdout, stderr, the JSON result line)."""
  capsys.readouterr()
  code = et.run_cli(bench_cli, args)
  captured = capsys.readouterr()
  lines = [l for l in captured.out.splitlines() if l.startswith('{')]
  return code, captured.out, captured.err, json.loads(lines[-1])


def test_every_format_in_one_table_and_json(models, tmp_path, capsys):
  json_path = tmp_path / 'bench.json'
  code, out, err, line = _bench([
      '--exported_model=%s,%s' % (models['.pb'], models['SavedModel']),
      '--exported_model=' + models['.tflite float32'],
      '--exported_model=' + models['.tflite int8'], '--bench_threads=1',
      '--bench_batch_size=2', '--bench_runs=2', '--bench_warmup_runs=1',
      '--bench_json=%s' % json_path], capsys)
  assert code == 0, err[-3000:]
  assert (line['status'], line['mode']) == ('ok', 'exported')
  results = line['results']
  assert [r['label'] for r in results] == list(LABELS)
  assert [r['path'] for r in results] == [models[l] for l in LABELS]
  for r in results:
    assert set(r) == set(exported.RESULT_FIELDS)
    # The .pb and SavedModel take any size: they get the .tflite size.
    assert r['image_size'] == [41, 41] and r['threads'] == 1
    assert r['batch_size'] == 2 and r['runs'] == 2
    for key in ('model_bytes', 'load_seconds', 'first_call_seconds',
                'batch1_ms_median', 'batch1_ms_p90', 'batch1_images_per_sec',
                'batchn_ms_median', 'batchn_ms_p90', 'batchn_images_per_sec',
                'cores_used', 'peak_rss_mib'):
      assert r[key] > 0, (r['label'], key)
    assert r['batch1_ms_p90'] >= r['batch1_ms_median']
  by_label = {r['label']: r for r in results}
  assert by_label['SavedModel']['batch_runs'] == exported.ONE_RUN
  for label in ('.pb', '.tflite float32', '.tflite int8'):
    assert by_label[label]['batch_runs'] == exported.SINGLE_CALLS
  assert by_label['.tflite int8']['quantize'] == 'int8'
  assert by_label['.tflite float32']['quantize'] == 'none'
  saved = models['SavedModel']
  assert by_label['SavedModel']['model_bytes'] == sum(
      os.path.getsize(os.path.join(d, f))
      for d, _, files in os.walk(saved) for f in files)
  assert by_label['.pb']['model_bytes'] == os.path.getsize(models['.pb'])
  # The table: a row per model, the note on single calls, the CPU.
  table = out[:out.index('{')]
  for label in LABELS:
    assert label in table
  assert 'b2 img/s' in table and 'a batch of 2 is 2 single calls' in table
  assert 'CPU: ' in table
  written = [json.loads(l) for l in json_path.read_text().splitlines()]
  assert written == results


def test_thread_counts_and_sizes():
  """'all' is every usable core; repeats are dropped; a fixed-size model
  sets the size of the others."""
  flags = bench_cli.FLAGS
  flags.unparse_flags()
  flags(['prog', '--bench_threads=1,all,1', '--exported_model=x.pb'])
  cores = cpu_lib.usable_cores()
  assert bench_cli._thread_counts() == tuple(dict.fromkeys((1, cores)))
  facts = [exported.ModelFacts('a.pb', loaded.FROZEN_GRAPH, None),
           exported.ModelFacts('b.tflite', loaded.TFLITE, (41, 33))]
  assert exported.image_sizes(facts) == [(41, 33), (41, 33)]
  assert exported.image_sizes(facts, (65, 65)) == [(65, 65), (41, 33)]
  with pytest.raises(config.ConfigError,
                     match='any size.*image_size'):
    exported.image_sizes(facts[:1])


def test_training_flags_with_exported_model_are_named_as_unread(caplog):
  """--model_variant=xception_65 beside --exported_model was silently
  ignored (deeplab-stats refuses another command's flags)."""
  flags = bench_cli.FLAGS
  flags.unparse_flags()
  try:
    flags(['prog', '--exported_model=x.pb', '--model_variant=xception_65',
           '--train_batch_size=4', '--bench_runs=3', '--bench_json=r.json',
           '--logtostderr'])
    with caplog.at_level('WARNING'):
      job = bench_cli.exported_options_from_flags()
  finally:
    flags.unparse_flags()
  assert job.options.runs == 3
  warned = [r.getMessage() for r in caplog.records
            if 'not read with --exported_model' in r.getMessage()]
  assert len(warned) == 1 and warned[0].startswith(
      '--model_variant, --train_batch_size not read with --exported_model: '
      'the models are measured as exported'), warned


def _fails(args, capsys):
  """Runs deeplab-bench expecting exit 2; returns stderr + the JSON line."""
  code, _, err, line = _bench(args, capsys)
  assert code == 2, err
  assert line['status'] == 'bad_input'
  return err


def test_bad_input_names_the_flag(models, tmp_path, capsys):
  missing = str(tmp_path / 'nowhere.pb')
  err = _fails(['--exported_model=' + missing], capsys)
  assert '--exported_model=%s does not exist' % missing in err
  junk = tmp_path / 'junk.pb'
  junk.write_bytes(b'not a graph at all')
  err = _fails(['--exported_model=%s,%s' % (models['.pb'], junk)], capsys)
  assert '--exported_model=%s is not a known exported model' % junk in err
  folder = tmp_path / 'empty_folder'
  folder.mkdir()
  err = _fails(['--exported_model=%s' % folder], capsys)
  assert '--exported_model=%s is a folder but not a SavedModel' % folder in err
  assert '--bench_image_size' in _fails(
      ['--exported_model=' + models['.pb']], capsys)
  assert '--bench_threads' in _fails(
      ['--exported_model=' + models['.pb'], '--bench_threads=many'], capsys)
  assert '--bench_batch_size' in _fails(
      ['--exported_model=' + models['.pb'], '--bench_batch_size=0'], capsys)
  assert '--bench_variants' in _fails(
      ['--exported_model=' + models['.pb'], '--bench_variants=bf16'], capsys)
  # An output that cannot be written was found after the whole measuring
  # ('cannot write ...: File exists', exit 1).
  err = _fails(['--exported_model=' + models['.pb'],
                '--bench_json=%s/x.jsonl' % junk], capsys)
  assert '--bench_json=%s/x.jsonl is under %s, which is a file' % (
      junk, junk) in err


def test_image_too_large_in_the_child_is_bad_input(models, capsys):
  """The child's refusal (exit 2) is the command's, with its message."""
  err = _fails(['--exported_model=' + models['.pb'], '--bench_threads=1',
                '--bench_image_size=50,50', '--bench_runs=1',
                '--bench_warmup_runs=0'], capsys)
  assert 'too large for the exported model %s: ' % models['.pb'] in err
  # The flag to change is named (the hint was only to re-export).
  assert err.startswith('deeplab-bench: error: --bench_image_size=50,50: ')
  assert err.rstrip().endswith('; or give a smaller --bench_image_size'), err


def test_table_of_fake_results():
  result = dict.fromkeys(exported.RESULT_FIELDS, 1.0)
  result.update(name='m.tflite', label='.tflite int8', image_size=[9, 9],
                threads=2, batch_size=4, batch_runs=exported.SINGLE_CALLS,
                runs=5, warmup_runs=1, model_bytes=3 * 2 ** 20,
                load_average=[0.5, 0.7])
  table = exported.format_table([result], cpu={'model_name': 'Test CPU',
                                               'logical_cpus': 2,
                                               'usable_cores': 2})
  assert '.tflite int8' in table and '3.00' in table and '4 calls' in table
  assert 'a batch of 4 is 4 single calls' in table
  assert 'CPU: Test CPU, 2 logical CPUs' in table
