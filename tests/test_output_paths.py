"""Output paths are checked before any work (cli/output_paths.py)."""
import os

import pytest

from deeplab_train.cli import output_paths
from deeplab_train.config import ConfigError


@pytest.fixture
def place(tmp_path):
  (tmp_path / 'a_file').write_text('keep me')
  (tmp_path / 'a_folder').mkdir()
  return tmp_path


@pytest.mark.parametrize('check, name, message', [
    (output_paths.check_output_folder, 'a_file',
     'is a file, not a folder'),
    (output_paths.check_output_folder, 'a_file/sub',
     'is under {}/a_file, which is a file'),
    (output_paths.check_output_file, 'a_folder', 'is a folder'),
    (output_paths.check_output_file, 'a_file/x/out.pb',
     'is under {}/a_file, which is a file'),
])
def test_wrong_kind_of_path_names_the_flag(place, check, name, message):
  with pytest.raises(ConfigError) as error:
    check('some_flag', str(place / name))
  assert str(error.value).startswith('--some_flag=%s ' % (place / name))
  assert message.format(place) in str(error.value)
  assert (place / 'a_file').read_text() == 'keep me'


def test_writable_places_pass_and_nothing_is_created(place):
  output_paths.check_output_folder('f', str(place / 'a_folder'))
  output_paths.check_output_folder('f', str(place / 'new' / 'deeper'))
  output_paths.check_output_file('f', str(place / 'a_file'))
  output_paths.check_output_file('f', str(place / 'new' / 'out.json'))
  output_paths.check_output_folder('f', None)
  # The write checks leave nothing behind.
  assert sorted(os.listdir(place)) == ['a_file', 'a_folder']
  assert os.listdir(place / 'a_folder') == []


@pytest.mark.parametrize('check, name, message', [
    (output_paths.check_output_folder, 'a_folder', 'is not writable'),
    (output_paths.check_output_folder, 'a_folder/new',
     'cannot be created: {}/a_folder is not writable'),
    (output_paths.check_output_file, 'a_folder/out.pb',
     'cannot be created: {}/a_folder is not writable'),
])
def test_read_only_folder_is_named(place, monkeypatch, check, name, message):
  # Root may write anywhere, so the permission answer is faked for one
  # folder (a chmod would not stop root).
  real_access = os.access
  read_only = str(place / 'a_folder')
  monkeypatch.setattr(output_paths.os, 'access', lambda p, mode: (
      False if p == read_only else real_access(p, mode)))
  with pytest.raises(ConfigError, match=message.format(place)):
    check('some_flag', str(place / name))


@pytest.mark.skipif(not os.path.isdir('/proc/self'),
                    reason='needs Linux /proc')
@pytest.mark.parametrize('check, path, message', [
    (output_paths.check_output_folder, '/proc/deeplab-out',
     'cannot be created: /proc refuses new entries'),
    (output_paths.check_output_file, '/proc/deeplab-out/x.pb',
     'cannot be created: /proc refuses new entries'),
    (output_paths.check_output_folder, '/proc/self',
     'is not writable'),
])
def test_a_folder_that_refuses_even_root_is_named(check, path, message):
  """/proc takes no new entries from anyone, root included, although its
  permission bits let root write (os.access says yes)."""
  with pytest.raises(ConfigError, match=message) as error:
    check('vis_logdir', path)
  assert str(error.value).startswith('--vis_logdir=%s ' % path)


def test_braces_in_paths_are_not_option_references(place):
  odd = place / '{run.1}'
  odd.write_text('')
  with pytest.raises(ConfigError) as error:
    output_paths.check_output_folder('eval_logdir', str(odd))
  assert '{run.1}' in str(error.value)


@pytest.mark.parametrize('check', [output_paths.check_output_folder,
                                   output_paths.check_output_file])
def test_a_url_is_refused(tmp_path, monkeypatch, check):
  """--train_logdir=gs://... (the original wrote through tf.gfile) made a
  local folder named 'gs:', built the graph, and failed with exit 1."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError) as error:
    check('train_logdir', 'gs://bucket/deeplab/train')
  assert str(error.value) == (
      '--train_logdir=gs://bucket/deeplab/train is a URL: the outputs are '
      'written to a local or mounted file system (a bucket mounted with '
      'gcsfuse, say); give a path there and copy the results where you want '
      'them')
  assert os.listdir(tmp_path) == []
