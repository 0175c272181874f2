"""SIGTERM / SIGINT in the commands without a clean stop of their own
(deeplab-eval, -vis, -export, -stats, -build-data: cli/app.run_body): the
command stops where it is with one line and its result line, exits 143 /
130, and leaves no temp file or half-written output.

Before, SIGINT ended them with a KeyboardInterrupt traceback (and
deeplab-eval / -vis then hung for good closing their session at exit),
SIGTERM with no result line, and a build's temp shards stayed.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from deeplab_train.cli import app
from deeplab_train.cli import build_data as build_cli
from deeplab_train.cli import signals
from deeplab_train.cli import eval as eval_cli
from deeplab_train.data import build
from deeplab_train.evaluation import eval_loop
import eval_testing as et
import test_data_common as common
import train_testing as tt


def _signal_self_after(count, signum, items, slept):
  """Yields `items`, sending this process `signum` after `count` of them
  (the signal's handler runs in the main thread while it sleeps). Appends
  to `slept` if the sleep ran to its end, i.e. the command went on after
  the signal instead of stopping in the sleep."""
  for index, item in enumerate(items):
    if index == count:
      os.kill(os.getpid(), signum)
      time.sleep(30)
      slept.append(True)
    yield item


def test_sigint_while_scoring_stops_eval_with_130(tmp_path, monkeypatch,
                                                  capsys):
  data = et.write_tiny_dataset(str(tmp_path))
  train = str(tmp_path / 'train')
  et.write_checkpoint(train, et.tiny_model_options())
  samples = eval_loop.iterate_split
  slept = []
  monkeypatch.setattr(
      eval_loop, 'iterate_split', lambda *args, **kwargs: _signal_self_after(
          1, signal.SIGINT, samples(*args, **kwargs), slept))
  eval_dir = tmp_path / 'eval'
  code = et.run_cli(eval_cli, ['--checkpoint_dir=' + train,
                               '--dataset_dir=' + data,
                               '--eval_logdir=%s' % eval_dir])
  out, err = capsys.readouterr()
  assert code == 130
  assert not slept  # stopped in the sleep, not after it
  assert err.splitlines()[-1] == 'deeplab-eval: stopped by SIGINT'
  assert 'Traceback' not in err
  assert json.loads(out.splitlines()[-1]) == {
      'event': 'result', 'status': 'interrupted',
      'message': 'stopped by SIGINT'}
  assert not eval_dir.exists() or not [
      name for name in os.listdir(eval_dir) if not name.startswith('events')]
  # The handlers are the ones from before again.
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _built_in_2_shards(tmp_path, seed):
  """Converts a small VOC folder into tmp_path/out in 2 shards; returns
  the deeplab-build-data arguments that did."""
  images, labels, lists = common.write_voc_folder(
      str(tmp_path / 'voc'), {'train': common.tiny_pairs(seed, 4)})
  args = ['--image_folder', images, '--semantic_segmentation_folder', labels,
          '--list_folder', lists, '--image_format', 'png', '--output_dir',
          str(tmp_path / 'out'), '--num_classes', '4', '--num_shards', '2']
  assert tt.main_in_process('deeplab-build-data', build_cli.main, args)[0] == 0
  return args


def test_sigterm_while_converting_stops_the_build_with_143(tmp_path,
                                                           monkeypatch,
                                                           capsys):
  args = _built_in_2_shards(tmp_path, 60)
  before = common.folder_contents(tmp_path / 'out')
  write_shard = build._write_shard

  def signalled(entries, temp_path, options, stop):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # the main thread stops meanwhile
    return write_shard(entries, temp_path, options, stop)
  monkeypatch.setattr(build, '_write_shard', signalled)
  code, _, result = tt.main_in_process(
      'deeplab-build-data', build_cli.main, args + ['--num_shards', '3'])
  err = capsys.readouterr().err
  assert code == 143
  assert result == {'event': 'result', 'status': 'terminated',
                    'message': 'stopped by SIGTERM'}
  assert err.splitlines()[-1] == 'deeplab-build-data: stopped by SIGTERM'
  # The build before is as it was: no new shard, no temp left.
  assert common.folder_contents(tmp_path / 'out') == before


@pytest.mark.parametrize('during', ['the journal', 'the renames'])
def test_a_signal_while_the_build_switches_waits_for_the_switch(
    during, tmp_path, monkeypatch, capsys):
  """A SIGTERM while the switch's journal was written left the whole new
  build as temp files; one between the renames left a folder every reader
  refused as half-switched. The switch now ends first: the new build is in
  place and nothing else is left."""
  args = _built_in_2_shards(tmp_path, 61)
  if during == 'the journal':
    target, name = build.atomic, 'write_json'
  else:
    # The first shard's rename into place.
    target, name = os, 'replace'
  real = getattr(target, name)

  def signalled(*a, **k):
    if name == 'write_json' or '.tfrecord' in os.path.basename(a[0]):
      monkeypatch.setattr(target, name, real)
      os.kill(os.getpid(), signal.SIGTERM)
    return real(*a, **k)
  write_split = build.write_split

  def then_signalled(*a, **k):
    # Set once the new shards are written: only the switch's calls.
    out = write_split(*a, **k)
    monkeypatch.setattr(target, name, signalled)
    return out
  monkeypatch.setattr(build, 'write_split', then_signalled)
  code, _, result = tt.main_in_process(
      'deeplab-build-data', build_cli.main, args + ['--num_shards', '3'])
  capsys.readouterr()
  assert (code, result['status']) == (143, 'terminated')
  assert getattr(target, name) is real  # the signal was sent
  assert sorted(os.listdir(tmp_path / 'out')) == [
      'dataset.json'] + ['train-%05d-of-00003.tfrecord' % i for i in range(3)]


def test_a_signal_just_before_the_switch_leaves_the_build_before(
    tmp_path, monkeypatch, capsys):
  """Between the new files' writing and the switch's held signals, a
  SIGTERM left the whole new build as temp files."""
  args = _built_in_2_shards(tmp_path, 62)
  before = common.folder_contents(tmp_path / 'out')
  switch = build._switch

  def signalled(*a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    return switch(*a, **k)
  monkeypatch.setattr(build, '_switch', signalled)
  code, _, _ = tt.main_in_process(
      'deeplab-build-data', build_cli.main, args + ['--num_shards', '3'])
  capsys.readouterr()
  assert code == 143
  assert common.folder_contents(tmp_path / 'out') == before


def test_a_switch_that_fails_with_a_signal_held_still_says_why(
    tmp_path, monkeypatch, capsys, caplog):
  """The held signal's stop took the place of the switch's error: the
  user read 'stopped by SIGTERM' only, not what failed."""
  args = _built_in_2_shards(tmp_path, 63)
  follow = build._follow

  def signalled_then_failing(*a, **k):
    os.kill(os.getpid(), signal.SIGTERM)
    raise PermissionError(13, 'Permission denied', 'train-00000')
  monkeypatch.setattr(build, '_follow', signalled_then_failing)
  with caplog.at_level('ERROR'):
    code, _, result = tt.main_in_process(
        'deeplab-build-data', build_cli.main, args + ['--num_shards', '3'])
  capsys.readouterr()
  assert (code, result['status']) == (143, 'terminated')
  assert ('Permission denied, while renaming the new build into place; the '
          'next deeplab-build-data on this folder finishes that'
          in caplog.text)
  # It does.
  monkeypatch.setattr(build, '_follow', follow)
  assert tt.main_in_process('deeplab-build-data', build_cli.main,
                            args + ['--num_shards', '3'])[0] == 0
  assert sorted(os.listdir(tmp_path / 'out')) == [
      'dataset.json'] + ['train-%05d-of-00003.tfrecord' % i for i in range(3)]


def test_a_stop_that_tensorflow_turned_into_another_error_is_a_stop(capsys):
  """A SIGTERM raised while TensorFlow's C++ code hands an error back came
  out as pybind11's RuntimeError ('MISMATCH ... REPLACED BY Stopped'): the
  export ended with exit 1, a traceback and status error (seen once in an
  audit, in tf.import_graph_def)."""
  def body():
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(30)
    except signals.Stopped:
      raise RuntimeError('pybind11::error_already_set: MISMATCH of original '
                         'and normalized active exception types') from None
  code = app.run_body('deeplab-export', ['prog'], body)
  out, err = capsys.readouterr()
  assert code == 143
  assert json.loads(out.splitlines()[-1]) == {
      'event': 'result', 'status': 'terminated',
      'message': 'stopped by SIGTERM'}
  assert 'Traceback' not in err


def test_a_signal_after_the_result_keeps_the_commands_exit_code(tmp_path):
  """A SIGTERM after the result line (the interpreter shutting down, a
  second or so with TensorFlow) ended a finished export with 143."""
  script = textwrap.dedent("""
      import atexit, os, signal, sys, time
      from deeplab_train.cli import app
      def late_signal():
        # Ignored from here on: Python's shut-down puts the default
        # handlers back after atexit, where an 'end at once' handler was
        # replaced and a signal ended the process with 143.
        sys.stderr.write('ignored: %s\\n' % (
            signal.getsignal(signal.SIGTERM) == signal.SIG_IGN))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
      atexit.register(late_signal)
      app.start('deeplab-x', lambda argv: print('{"status": "ok"}'), 'doc')
      """)
  proc = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, env=tt.subprocess_env(), timeout=60,
                        cwd=str(tmp_path))
  assert (proc.returncode, proc.stdout) == (0, '{"status": "ok"}\n'), (
      proc.stderr[-2000:])
  assert 'ignored: True' in proc.stderr


def test_a_signal_after_the_last_result_line_keeps_it_the_last(capsys):
  """A SIGTERM in a command's clean-ups after its 'ok' line (a checkpoint's
  pin released, a model closed) raised Stopped there: a second result line,
  'terminated', and exit 143 for finished work."""
  cleaned = []

  def body():
    app.print_final_result('ok', answer=1)
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.2)
    finally:
      cleaned.append(True)
  assert app.run_body('deeplab-x', ['prog'], body) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [json.loads(l)['status'] for l in lines] == ['ok']
  assert cleaned == [True]


def test_a_second_signal_after_a_clean_stop_keeps_the_exit_code(
    monkeypatch, capsys):
  """deeplab-train stopped cleanly on a first SIGTERM and printed its 'ok'
  result; a second one while the process shut down (Ctrl-C pressed twice,
  a supervisor; TensorFlow's teardown takes a second or more) reached its
  signal thread, which took it for 'stop now' and exited 143."""
  exits = []

  def exit_now(code):
    exits.append(code)
    raise SystemExit(code)

  monkeypatch.setattr(signals.os, '_exit', exit_now)
  monkeypatch.setattr(signals, 'DUPLICATE_SECS', 0)
  process = signals.ProcessSignals()  # not installed: no handlers set
  stopped_now = []
  process.connect(on_first=lambda name: None, on_stop_now=stopped_now.append)
  process._received(signal.SIGTERM)  # pylint: disable=protected-access
  assert exits == [] and 'SIGTERM received' in capsys.readouterr().err
  process.finished(0)  # what exit_on_signal tells it
  with pytest.raises(SystemExit):
    process._received(signal.SIGTERM)  # pylint: disable=protected-access
  assert (exits, stopped_now) == ([0], [])


def test_a_second_signal_does_not_break_into_the_cleanup(capsys):
  """The copy of a SIGTERM that a wrapper script hands on (its process
  group got the first) was raised again inside the cleanup the first one
  started: temp files stayed, and the command ended with a traceback."""
  cleaned = []

  def body():
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(30)
    finally:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.2)   # the handler runs in here
      cleaned.append(True)
  code = app.run_body('deeplab-export', ['prog'], body)
  out, err = capsys.readouterr()
  assert (code, cleaned) == (143, [True])
  assert json.loads(out.splitlines()[-1])['status'] == 'terminated'
  assert 'Traceback' not in err


def test_a_signal_just_after_the_handler_is_set_is_kept():
  """install() set the handlers, then the wake-up descriptor: a SIGTERM in
  between showed as caught (a test sent it then) and was lost, and the run
  trained to its end."""
  code = textwrap.dedent('''
      import os, signal, time
      from deeplab_train.cli import signals
      real = signal.signal
      def set_then_signalled(sig, handler):
        previous = real(sig, handler)
        if sig == signal.SIGTERM:
          os.kill(os.getpid(), signal.SIGTERM)
        return previous
      signal.signal = set_then_signalled
      process = signals.ProcessSignals()
      process.install()
      signal.signal = real
      deadline = time.time() + 10
      while process.pending is None and time.time() < deadline:
        time.sleep(0.01)
      print(process.pending)
      ''')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=60)
  assert result.stdout.strip() == 'SIGTERM', result.stderr
