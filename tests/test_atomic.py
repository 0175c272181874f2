"""Writes that fail (a full disk, ...) leave the old output and no temp
behind, and say which path they could not write (atomic.py); the commands
report them in one line, exit 1 (cli/app.py, the logdir lock)."""
import errno
import json
import os
import socket

import pytest

from deeplab_train import atomic
from deeplab_train import locking
from deeplab_train.cli import app
from deeplab_train.runtime import lock as lock_lib

import train_testing as tt


def _full_disk(*_):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failed_file_write_names_the_path_and_keeps_the_old_file(tmp_path):
  path = tmp_path / 'result.json'
  atomic.write_json(str(path), {'old': 1})
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    atomic.write_with(str(path), _full_disk)
  assert str(error.value) == ('cannot write %s: No space left on device'
                              % path)
  assert error.value.errno == errno.ENOSPC
  assert error.value.filename == str(path)
  assert json.loads(path.read_text()) == {'old': 1}
  assert os.listdir(tmp_path) == ['result.json']


def test_outputs_written_together_are_all_new_or_all_old(tmp_path):
  """A command's outputs written in one `together` block: a failure at the
  last leaves the first as it was (before, it was already the new one)."""
  first, folder = tmp_path / 'frozen.pb', tmp_path / 'saved_model'
  first.write_text('old')
  folder.mkdir()
  (folder / 'saved_model.pb').write_text('old')
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    with atomic.together():
      atomic.write_bytes(str(first), b'new')
      assert first.read_text() == 'old'   # not in place before the end
      with atomic.writing_dir(str(folder)) as tmp:
        os.makedirs(tmp)
        _full_disk()
  assert error.value.filename == str(folder)
  assert first.read_text() == 'old'
  assert os.listdir(folder) == ['saved_model.pb']
  assert sorted(os.listdir(tmp_path)) == ['frozen.pb', 'saved_model']
  # Any error removes the temps too; a block that ends well puts all in place.
  with pytest.raises(KeyboardInterrupt):
    with atomic.together():
      atomic.write_bytes(str(first), b'new')
      raise KeyboardInterrupt
  assert sorted(os.listdir(tmp_path)) == ['frozen.pb', 'saved_model']
  with atomic.together():
    atomic.write_bytes(str(first), b'new')
    with atomic.writing_dir(str(folder)) as tmp:
      os.makedirs(tmp)
      (tmp_path / os.path.basename(tmp) / 'new.pb').write_text('new')
  assert first.read_text() == 'new' and os.listdir(folder) == ['new.pb']
  assert sorted(os.listdir(tmp_path)) == ['frozen.pb', 'saved_model']


def test_a_folder_where_a_file_of_the_block_goes_changes_none(tmp_path):
  """eval's three result files: a folder at eval_result.json failed its
  rename after the two confusion matrix files were replaced, leaving
  results of two evaluations side by side."""
  csv, png, json_path = (tmp_path / 'c.csv', tmp_path / 'c.png',
                         tmp_path / 'result.json')
  csv.write_text('old')
  png.write_text('old')
  json_path.mkdir()
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    with atomic.together():
      for path in (csv, png, json_path):
        atomic.write_bytes(str(path), b'new')
  assert error.value.filename == str(json_path)
  assert 'Is a directory' in str(error.value)
  assert csv.read_text() == 'old' and png.read_text() == 'old'
  assert sorted(os.listdir(tmp_path)) == ['c.csv', 'c.png', 'result.json']


def test_a_writers_error_names_the_output_not_its_temp(tmp_path):
  """TensorFlow's SavedModel writer names the file it failed on, inside the
  temp folder: 'cannot write OUT/sm: OUT/.sm.tmp-PID@HOST/saved_model.pb;
  No space left on device' showed a name the user never gave."""
  folder = str(tmp_path / 'sm')
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    with atomic.writing_dir(folder) as tmp:
      raise OSError('%s; No space left on device'
                    % os.path.join(tmp, 'saved_model.pb'))
  assert str(error.value) == (
      'cannot write %s: %s/saved_model.pb; No space left on device'
      % (folder, folder))


def test_a_failed_folder_write_removes_its_temp_and_keeps_the_old(tmp_path):
  folder = tmp_path / 'export'
  folder.mkdir()
  (folder / 'old.pb').write_text('old')
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    with atomic.writing_dir(str(folder)) as tmp:
      os.makedirs(tmp)
      with open(os.path.join(tmp, 'part'), 'w') as f:
        f.write('partial')
      _full_disk()
  assert str(error.value) == ('cannot write %s: No space left on device'
                              % folder)
  # Another error is not an output error, and is cleaned up the same way.
  with pytest.raises(ValueError):
    with atomic.writing_dir(str(folder)) as tmp:
      os.makedirs(tmp)
      raise ValueError('a bug')
  assert sorted(os.listdir(tmp_path)) == ['export']
  assert os.listdir(folder) == ['old.pb']
  # And a block that ends well replaces the folder.
  with atomic.writing_dir(str(folder)) as tmp:
    os.makedirs(tmp)
    (tmp_path / os.path.basename(tmp) / 'new.pb').write_text('new')
  assert os.listdir(folder) == ['new.pb']
  assert sorted(os.listdir(tmp_path)) == ['export']


def test_a_lock_that_cannot_be_written_is_not_taken(tmp_path, monkeypatch):
  monkeypatch.setattr(locking, '_write_holder', _full_disk)
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    with lock_lib.LogdirLock(str(tmp_path)):
      pass
  assert str(error.value) == 'cannot write %s: No space left on device' % (
      tmp_path / lock_lib.LOCK_FILENAME)
  assert os.listdir(tmp_path) == []
  monkeypatch.undo()
  with lock_lib.LogdirLock(str(tmp_path)):
    assert os.listdir(tmp_path) == [lock_lib.LOCK_FILENAME]


def test_commands_report_an_output_not_written_in_one_line(capsys):
  def body():
    raise atomic.OutputNotWrittenError('/out/x.pb', 'No space left on device',
                                       errno.ENOSPC)
  assert app.run_body('deeplab-export', ['deeplab-export'], body) == (
      app.EXIT_UNEXPECTED)
  out, err = capsys.readouterr()
  assert err == ('deeplab-export: error: cannot write /out/x.pb: No space '
                 'left on device\n')
  assert json.loads(out) == {
      'event': 'result', 'status': 'error',
      'message': 'cannot write /out/x.pb: No space left on device'}


def _can_exchange(folder):
  a, b = folder / 'a', folder / 'b'
  a.mkdir()
  b.mkdir()
  try:
    return atomic._exchange(str(a), str(b))
  finally:
    os.rmdir(a)
    os.rmdir(b)


def test_a_folder_is_replaced_without_a_moment_missing(tmp_path, monkeypatch):
  """Where the system swaps two paths in one step (Linux file systems that
  support renameat2's RENAME_EXCHANGE, e.g. ext4, xfs, tmpfs), a kill at
  any moment of replace_dir leaves the old folder or the new one at the
  path, never none: the two renames of the fallback are not used."""
  folder = tmp_path / 'export'
  folder.mkdir()
  (folder / 'old.pb').write_text('old')
  exchange = _can_exchange(tmp_path)
  if exchange:
    def killed(*_):
      raise AssertionError('a rename that leaves the path missing')
    monkeypatch.setattr(os, 'rename', killed)
  with atomic.writing_dir(str(folder)) as tmp:
    os.makedirs(tmp)
    (tmp_path / os.path.basename(tmp) / 'new.pb').write_text('new')
  assert os.listdir(folder) == ['new.pb']
  assert sorted(os.listdir(tmp_path)) == ['export']
  # A system without it (the fallback) swaps through two renames.
  monkeypatch.undo()
  monkeypatch.setattr(atomic, '_exchange', lambda a, b: False)
  with atomic.writing_dir(str(folder)) as tmp:
    os.makedirs(tmp)
    (tmp_path / os.path.basename(tmp) / 'newer.pb').write_text('newer')
  assert os.listdir(folder) == ['newer.pb']
  assert sorted(os.listdir(tmp_path)) == ['export']
  assert exchange == (os.uname().sysname == 'Linux')


def test_temps_of_killed_writers_are_removed_by_the_next_write(tmp_path):
  """A killed writer leaves its temp (a partial .pb, a SavedModel folder);
  the next write of that path removes those of processes of this host that
  are gone, and leaves a live writer's and another host's alone."""
  host = socket.gethostname()
  dead = tt.dead_pid()
  model = tmp_path / 'model.pb'
  model.write_bytes(b'old')
  dead_temps = ['.model.pb.tmp-%d@%s' % (dead, host),
                '.model.pb.tmp-%d' % dead]  # named before the host was added
  live_temps = ['.model.pb.tmp-%d@%s' % (os.getppid(), host),
                '.model.pb.tmp-%d@another-host' % dead,
                '.other.pb.tmp-%d@%s' % (dead, host)]
  for name in dead_temps + live_temps:
    (tmp_path / name).write_bytes(b'partial')
  atomic.write_bytes(str(model), b'new')
  assert sorted(os.listdir(tmp_path)) == sorted(['model.pb'] + live_temps)
  # A SavedModel-like folder: a killed writer's temp folder goes too.
  saved = tmp_path / 'saved'
  saved.mkdir()
  (tmp_path / ('.saved.tmp-%d@%s' % (dead, host))).mkdir()
  (tmp_path / ('.saved.tmp-%d@%s' % (dead, host)) / 'variables').mkdir()
  with atomic.writing_dir(str(saved)) as tmp:
    os.makedirs(tmp)
  assert not [n for n in os.listdir(tmp_path) if n.startswith('.saved')]
  # While the path is missing, what a killed replace_dir put aside is kept
  # for atomic.finish_replace_dir, with its finished replacement.
  aside = tmp_path / ('.gone.tmp-%d@%s.old' % (dead, host))
  aside.mkdir()
  finished = tmp_path / ('.gone.tmp-%d@%s' % (dead, host))
  finished.mkdir()
  with atomic.writing_dir(str(tmp_path / 'gone')) as tmp:
    os.makedirs(tmp)
  assert aside.is_dir() and finished.is_dir()
  # A first write that was killed (nothing in place yet, nothing put
  # aside): its temp goes at the next write, not one write later.
  first = tmp_path / ('.first.pb.tmp-%d@%s' % (dead, host))
  first.write_bytes(b'partial')
  atomic.write_bytes(str(tmp_path / 'first.pb'), b'new')
  assert not first.exists()
  first_dir = tmp_path / ('.first_saved.tmp-%d@%s' % (dead, host))
  first_dir.mkdir()
  with atomic.writing_dir(str(tmp_path / 'first_saved')) as tmp:
    os.makedirs(tmp)
  assert not first_dir.exists()


def test_temp_names_carry_pid_and_host_and_name_their_target(tmp_path):
  name = os.path.basename(atomic.temp_name(str(tmp_path / 'x.json')))
  assert name == '.x.json.tmp-%d@%s' % (os.getpid(), socket.gethostname())
  assert atomic.temp_target(name) == 'x.json'
  assert atomic.temp_target(name + '.old') == 'x.json'
  assert atomic.temp_target('.x.json.tmp-12') == 'x.json'
  assert atomic.temp_target('x.json') is None
  assert atomic.temp_target('.x.json.tmp-abc') is None


def test_a_folder_another_writer_creates_meanwhile_is_replaced(tmp_path,
                                                               monkeypatch):
  """replace_dir found no folder at the path, but another writer renamed
  its own there before this one's rename (two exports of a new
  --saved_model_dir): this one replaces it instead of failing with
  'Directory not empty'."""
  folder = tmp_path / 'saved'
  lexists = os.path.lexists
  looks = []

  def created_meanwhile(path):
    found = lexists(path)
    if path == str(folder):
      looks.append(found)
      if len(looks) == 2:  # replace_dir's look (after the temp's cleanup)
        folder.mkdir()
        (folder / 'theirs.pb').write_text('theirs')
    return found
  monkeypatch.setattr(os.path, 'lexists', created_meanwhile)
  with atomic.writing_dir(str(folder)) as tmp:
    os.makedirs(tmp)
    (tmp_path / os.path.basename(tmp) / 'mine.pb').write_text('mine')
  assert looks == [False, False]
  assert os.listdir(folder) == ['mine.pb']
  assert sorted(os.listdir(tmp_path)) == ['saved']


def test_a_signal_between_the_renames_of_together_waits_for_the_last(
    tmp_path, monkeypatch):
  """A SIGTERM between two renames (the commands' handler raises there)
  left deeplab-export's frozen graph new and its .tflite old, after 'all
  new or all as they were'."""
  import signal  # pylint: disable=g-import-not-at-top

  class Stop(Exception):
    pass

  def stop(signum, frame):
    del frame
    raise Stop(signum)
  paths = [tmp_path / 'a.pb', tmp_path / 'b.tflite']
  for path in paths:
    path.write_bytes(b'old')
  replace = os.replace

  def replace_then_signal(src, dst):
    replace(src, dst)
    os.kill(os.getpid(), signal.SIGTERM)
  previous = signal.signal(signal.SIGTERM, stop)
  try:
    with pytest.raises(Stop):
      with atomic.together():
        monkeypatch.setattr(atomic.os, 'replace', replace_then_signal)
        for path in paths:
          atomic.write_bytes(str(path), b'new')
  finally:
    signal.signal(signal.SIGTERM, previous)
  monkeypatch.undo()
  assert [path.read_bytes() for path in paths] == [b'new', b'new']
  assert sorted(os.listdir(tmp_path)) == ['a.pb', 'b.tflite']
