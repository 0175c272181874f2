"""deeplab-build-data on a folder another build uses or a killed build left:
one build at a time (the folder's lock, exit 75), a build killed while
renaming its files into place is refused by readers and finished by the
next build, and temp files of killed builds are removed (data/build.py).
"""
import errno
import os

import pytest
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train import locking
from deeplab_train.config import ConfigError
from deeplab_train.data import build
from deeplab_train.data import datasets
from deeplab_train.data import pipeline
from deeplab_train.data import tfrecord
import test_data_common as common
import train_testing as tt

OPTIONS = build.BuildOptions(num_classes=4, dataset_name='tiny',
                             num_shards=2)


def voc(folder, splits):
  return common.write_voc_folder(str(folder), splits, image_format='png')


def build_voc(folders, out, options=OPTIONS, **kwargs):
  return build.build_voc(*folders, out, options, image_format='png',
                         **kwargs)


def _hold_lock(out):
  return build.folder_lock(out)


def test_a_second_build_on_a_locked_folder_is_refused(tmp_path):
  folders = voc(tmp_path / 'voc', {'train': common.tiny_pairs(40, 3)})
  out = str(tmp_path / 'out')
  build_voc(folders, out)
  before = common.folder_contents(out)
  with _hold_lock(out):
    with pytest.raises(locking.FolderLockedError) as error:
      build_voc(folders, out, build.BuildOptions(num_classes=4,
                                                 num_shards=3))
    message = str(error.value)
    assert message.startswith('%s is locked by a running deeplab-build-data '
                              '(pid %d on host ' % (out, os.getpid()))
    assert message.endswith('before starting another deeplab-build-data or '
                            'deeplab-stats --write_dataset_json on this '
                            'folder')
    assert {k: v for k, v in common.folder_contents(out).items()
            if k != build.LOCK_FILENAME} == before


def test_the_command_exits_75_on_a_locked_folder(tmp_path, capsys):
  from deeplab_train.cli import build_data as build_cli  # pylint: disable=g-import-not-at-top
  images, labels, lists = voc(tmp_path / 'voc',
                              {'train': common.tiny_pairs(41, 2)})
  out = tmp_path / 'out'
  out.mkdir()
  with _hold_lock(str(out)):
    code, _, result = tt.main_in_process('deeplab-build-data', build_cli.main, [
        '--image_folder', images, '--semantic_segmentation_folder', labels,
        '--list_folder', lists, '--image_format', 'png', '--output_dir',
        str(out), '--num_classes', '4'])
  err = capsys.readouterr().err
  assert code == 75
  assert result['status'] == 'locked'
  assert 'Traceback' not in err
  lines = [l for l in err.splitlines()
           if l.startswith('deeplab-build-data: error: ')]
  assert lines == ['deeplab-build-data: error: ' + result['message']]
  assert 'is locked by a running deeplab-build-data (pid %d' % os.getpid() in (
      result['message'])
  assert os.listdir(out) == []


class _Killed(BaseException):
  """Stands for a SIGKILL: nothing after it runs, not even cleanups."""


def _killed_after_renames(monkeypatch, count):
  """Makes the next build's switch stop after `count` renames, as a kill
  would (its temp files and journal stay)."""
  follow = build._follow

  def stop_half_way(output_dir, renames, remove):
    follow(output_dir, renames[:count], [])
    raise _Killed()
  monkeypatch.setattr(build, '_follow', stop_half_way)


def test_a_build_killed_while_switching_is_refused_then_finished(
    tmp_path, monkeypatch):
  old = voc(tmp_path / 'old', {'train': common.tiny_pairs(42, 6, prefix='o')})
  new_pairs = common.tiny_pairs(43, 4, prefix='n')
  new = voc(tmp_path / 'new', {'train': new_pairs,
                               'val': common.tiny_pairs(44, 2, prefix='v')})
  out = str(tmp_path / 'out')
  build_voc(old, out, build.BuildOptions(num_classes=4, num_shards=3,
                                         dataset_name='tiny'))
  # The new build has 2 shards a split: killed after renaming its first,
  # the folder holds 1 new and 3 old train shards and the old dataset.json.
  _killed_after_renames(monkeypatch, 1)
  with pytest.raises(_Killed):
    build_voc(new, out, split_name='train')
  monkeypatch.undo()
  assert len(tfrecord.list_split_files(out, 'train')) == 4
  assert datasets.read_dataset_json(out).splits_to_sizes == {'train': 6}
  with pytest.raises(ConfigError) as refused:
    pipeline.split_files(out, 'train')
  assert str(refused.value) == (
      '%s holds a half-switched build: a deeplab-build-data run stopped while '
      'renaming its new records into place (%s is left), so its splits may '
      'mix two builds; run deeplab-build-data with this output folder again: '
      'it finishes that build first' % (
          out, os.path.join(out, tfrecord.SWITCH_JOURNAL)))

  # The next build (of another split) first finishes the killed one's.
  info = build_voc(new, out, split_name='val')
  assert info.splits_to_sizes == {'train': 4, 'val': 2}
  assert sorted(common.folder_contents(out)) == [
      'dataset.json', 'train-00000-of-00002.tfrecord',
      'train-00001-of-00002.tfrecord', 'val-00000-of-00002.tfrecord',
      'val-00001-of-00002.tfrecord']
  files = pipeline.split_files(out, 'train')
  filenames = [tf.train.Example.FromString(raw).features.feature[
      tfrecord.IMAGE_FILENAME].bytes_list.value[0].decode()
               for path in files for raw in tf.io.tf_record_iterator(path)]
  assert filenames == [name for name, _, _ in new_pairs]


def test_temp_files_of_killed_builds_are_removed(tmp_path):
  folders = voc(tmp_path / 'voc', {'train': common.tiny_pairs(45, 2)})
  out = tmp_path / 'out'
  out.mkdir()
  leftovers = ['.train-00000-of-00003.tfrecord.tmp-99999',
               '.dataset.json.tmp-99999',
               '.%s.tmp-99999' % tfrecord.SWITCH_JOURNAL]
  others = ['.keep', '.notes.txt.tmp-99999', 'README']
  for name in leftovers + others:
    (out / name).write_text('x')
  build_voc(folders, str(out))
  assert sorted(os.listdir(out)) == sorted(others + [
      'dataset.json', 'train-00000-of-00002.tfrecord',
      'train-00001-of-00002.tfrecord'])


def test_a_journal_that_is_not_a_plan_is_named(tmp_path):
  folders = voc(tmp_path / 'voc', {'train': common.tiny_pairs(46, 2)})
  out = tmp_path / 'out'
  out.mkdir()
  journal = out / tfrecord.SWITCH_JOURNAL
  journal.write_text('{"renames": 3}')
  with pytest.raises(ConfigError) as error:
    build_voc(folders, str(out))
  assert str(error.value).startswith(
      '%s is not a switch plan deeplab-build-data wrote (' % journal)
  assert sorted(os.listdir(out)) == [tfrecord.SWITCH_JOURNAL]


def test_a_switch_plan_that_cannot_be_written_keeps_the_old_build(
    tmp_path, monkeypatch):
  out = str(tmp_path / 'out')
  build_voc(voc(tmp_path / 'old', {'train': common.tiny_pairs(47, 3)}), out)
  before = common.folder_contents(out)

  def full_disk(path, payload):
    raise atomic.not_written(path, OSError(errno.ENOSPC, 'No space left on '
                                           'device'))
  monkeypatch.setattr(atomic, 'write_json', full_disk)
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    build_voc(voc(tmp_path / 'new', {'train': common.tiny_pairs(48, 4)}), out)
  assert str(error.value) == (
      'cannot write %s: No space left on device; the records and '
      'dataset.json already there are unchanged' % out)
  assert common.folder_contents(out) == before  # and no temp file left


def test_a_switch_that_fails_half_way_is_finished_by_the_next_build(
    tmp_path, monkeypatch):
  out = str(tmp_path / 'out')
  build_voc(voc(tmp_path / 'old', {'train': common.tiny_pairs(49, 3)}), out)
  new = voc(tmp_path / 'new', {'train': common.tiny_pairs(50, 5)})
  replace = os.replace
  calls = []

  def fails_second_time(source, target):
    calls.append(target)
    if len(calls) == 2:
      raise OSError(errno.EIO, 'Input/output error')
    replace(source, target)
  monkeypatch.setattr(os, 'replace', fails_second_time)
  with pytest.raises(atomic.OutputNotWrittenError) as error:
    build_voc(new, out)
  monkeypatch.undo()
  assert str(error.value) == (
      'cannot write %s: Input/output error, while renaming the new build into '
      'place; the next deeplab-build-data on this folder finishes that' % out)
  with pytest.raises(ConfigError, match='half-switched'):
    pipeline.split_files(out, 'train')
  # Any build on the folder finishes it first (here the same one again).
  assert build_voc(new, out).splits_to_sizes == {'train': 5}
  assert datasets.read_dataset_json(out).splits_to_sizes == {'train': 5}
  assert len(pipeline.split_files(out, 'train')) == 2
