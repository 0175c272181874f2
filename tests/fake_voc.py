"""Test helpers for the shell scripts: small VOC-layout copies of data/.

The bundled sample data (data/, made by scripts/make_sample_data.py) is in
PASCAL VOC layout. These helpers copy a few of its images into
`VOCdevkit/VOC2012` (with a trainval list, as in the real tarball), pack it as
a tarball, and run the scripts with the repository's virtualenv on PATH and
a tiny model, so nothing touches the network.
"""
import hashlib
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile

import timeouts

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLE = REPO / 'data'
SCRIPTS = REPO / 'scripts'

# Tiny model settings passed to the scripts through their environment
# variables (mobilenet_v2 without ASPP/decoder, 0.25 depth, 65 px crops).
TINY_MODEL_ENV = {
    'RECIPE': 'mobilenet_v2',
    'DEPTH_MULTIPLIER': '0.25',
    'TRAIN_CROP_SIZE': '65,65',
    'TRAIN_BATCH_SIZE': '2',
    'FINE_TUNE_BATCH_NORM': 'false',
    'EVAL_CROP_SIZE': '',
    'VIS_CROP_SIZE': '',
    'EXPORT_CROP_SIZE': '65,65',
    'NUM_SHARDS': '1',
}


def sample_ids(split, count):
  """The first `count` ids of a split of the sample data."""
  lines = (SAMPLE / 'ImageSets' / 'Segmentation' / ('%s.txt' % split)
           ).read_text().split()
  if len(lines) < count:
    raise ValueError('data/ has only %d %s images' % (len(lines), split))
  return lines[:count]


def make_voc_root(root, num_train=6, num_val=3, extra_images=()):
  """Copies sample images into a VOC2012-like folder `root`.

  Args:
    root: folder to create (JPEGImages, SegmentationClass, ImageSets/...).
    num_train: images listed in train.txt.
    num_val: images listed in val.txt.
    extra_images: ids of further sample images copied as JPEGs only (like
      the VOC images that have no segmentation label).

  Returns:
    {'train': [...], 'val': [...]} the listed ids.
  """
  root = pathlib.Path(root)
  lists = root / 'ImageSets' / 'Segmentation'
  for sub in ('JPEGImages', 'SegmentationClass'):
    (root / sub).mkdir(parents=True, exist_ok=True)
  lists.mkdir(parents=True, exist_ok=True)
  splits = {'train': sample_ids('train', num_train),
            'val': sample_ids('val', num_val)}
  for ids in splits.values():
    for i in ids:
      copy_pair(i, root)
  for i in extra_images:
    shutil.copy(SAMPLE / 'JPEGImages' / ('%s.jpg' % i), root / 'JPEGImages')
  for split, ids in splits.items():
    (lists / ('%s.txt' % split)).write_text('\n'.join(ids) + '\n')
  (lists / 'trainval.txt').write_text(
      '\n'.join(splits['train'] + splits['val']) + '\n')
  return splits


def copy_pair(image_id, root):
  """Copies one sample image and its label into a VOC-layout folder."""
  root = pathlib.Path(root)
  shutil.copy(SAMPLE / 'JPEGImages' / ('%s.jpg' % image_id),
              root / 'JPEGImages')
  shutil.copy(SAMPLE / 'SegmentationClass' / ('%s.png' % image_id),
              root / 'SegmentationClass')


def make_voc_tarball(path, **kwargs):
  """Writes a fake VOCtrainval tarball (VOCdevkit/VOC2012/...) at `path`.

  Returns:
    (the listed ids per split, the tarball's MD5).
  """
  path = pathlib.Path(path)
  staging = path.parent / (path.name + '.staging')
  splits = make_voc_root(staging / 'VOCdevkit' / 'VOC2012', **kwargs)
  with tarfile.open(path, 'w') as tar:
    tar.add(staging / 'VOCdevkit', arcname='VOCdevkit')
  shutil.rmtree(staging)
  return splits, md5(path)


def md5(path):
  digest = hashlib.md5()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _script_variables():
  """Names of the variables the scripts read (${NAME...})."""
  names = set()
  for path in SCRIPTS.glob('*.sh'):
    names.update(re.findall(r'\$\{([A-Z][A-Z0-9_]*)', path.read_text()))
  return names - {'PATH', 'HOME', 'TMPDIR'}


def script_env(**overrides):
  """The environment the scripts run in: the virtualenv first on PATH.

  Settings of the scripts inherited from the caller's shell (WORK_DIR,
  CHECKSUM, ...) are dropped so that only `overrides` and the tiny model
  apply.
  """
  env = {k: v for k, v in os.environ.items()
         if k not in _script_variables()}
  env['PATH'] = '%s%s%s' % (pathlib.Path(sys.executable).parent, os.pathsep,
                            env.get('PATH', ''))
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env.update(TINY_MODEL_ENV)
  env.update({k: str(v) for k, v in overrides.items()})
  return env


def no_room_to_write():
  """preexec_fn of a process (and its children) whose writes to files fail
  as on a full disk: no file may grow (EFBIG instead of ENOSPC, the same
  paths in the code); pipes are not files, so its stdout still works."""
  resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited across exec


def run_script(name, *args, env=None, timeout=timeouts.HANG_SECONDS,
               preexec_fn=None):
  """Runs scripts/<name> with bash; returns the CompletedProcess."""
  return subprocess.run(
      ['bash', str(SCRIPTS / name)] + [str(a) for a in args],
      env=env if env is not None else script_env(), capture_output=True,
      text=True, timeout=timeout, check=False, preexec_fn=preexec_fn)


def describe(proc):
  """The output of a finished script, for assertion messages."""
  return 'exit %d\n--- stdout\n%s\n--- stderr\n%s' % (
      proc.returncode, proc.stdout[-4000:], proc.stderr[-6000:])
