"""The package as a user installs it: a wheel, in a new venv, run from
outside the source tree.

The wheel is built from a copy of the sources (what a clone has), installed
without its dependencies into a fresh venv that borrows the test venv's
site-packages for them (TensorFlow is too big to install again), and every
command then runs from a folder with nothing of the repository in it, so a
module or data file missing from the wheel fails here.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import train_testing as tt

pytestmark = pytest.mark.slow

REPO = tt.REPO
COMMANDS = ('deeplab-build-data', 'deeplab-train', 'deeplab-eval',
            'deeplab-vis', 'deeplab-export', 'deeplab-bench',
            'deeplab-stats')
# What a clone has that the build may read; the rest (venvs, outputs) not.
_NOT_SOURCES = shutil.ignore_patterns(
    '.git', '.venv', 'work', 'build', 'dist', '*.egg-info', '__pycache__',
    '.pytest_cache', 'tests')


def _run(args, cwd, env, timeout=300):
  proc = subprocess.run(args, cwd=str(cwd), env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, '%s exited %d\n%s\n%s' % (
      ' '.join(map(str, args)), proc.returncode, proc.stdout[-3000:],
      proc.stderr[-3000:])
  return proc


def _clean_env():
  env = {k: v for k, v in os.environ.items()
         if k not in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV')}
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  return env


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
  """Path of a wheel built from a copy of the sources."""
  root = tmp_path_factory.mktemp('wheel')
  source = root / 'src'
  shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
  # No build isolation: the build tools are those of the test venv, so the
  # build needs no download.
  _run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
        '--no-build-isolation', '--wheel-dir', str(root / 'dist'),
        str(source)], root, _clean_env())
  wheels = list((root / 'dist').glob('deeplab_train-*.whl'))
  assert len(wheels) == 1, wheels
  return wheels[0]


@pytest.fixture(scope='module')
def venv(wheel, tmp_path_factory):
  """bin/ folder of a new venv with the wheel installed (not editable)."""
  root = tmp_path_factory.mktemp('venv')
  _run([sys.executable, '-m', 'venv', '--without-pip', str(root)], root,
       _clean_env())
  python = root / 'bin' / 'python'
  # Lend the dependencies: a path line in a .pth file adds the test venv's
  # site-packages after the new venv's own, but the .pth files inside it
  # (the editable install of this repository among them) are not run.
  site = pathlib.Path(_run(
      [str(python), '-c', 'import sysconfig; '
       'print(sysconfig.get_paths()["purelib"])'], root,
      _clean_env()).stdout.strip())
  lent = sorted({sysconfig.get_paths()['purelib'],
                 sysconfig.get_paths()['platlib']})
  (site / 'lent_dependencies.pth').write_text('\n'.join(lent) + '\n')
  _run([sys.executable, '-m', 'pip', '--python', str(python), 'install',
        '--quiet', '--no-deps', '--no-index', str(wheel)], root,
       _clean_env())
  return root / 'bin'


def test_wheel_holds_every_module_of_the_package(wheel):
  with zipfile.ZipFile(wheel) as z:
    in_wheel = {n for n in z.namelist() if n.startswith('deeplab_train/')}
  in_tree = {str(p.relative_to(REPO))
             for p in (REPO / 'deeplab_train').rglob('*')
             if p.is_file() and '__pycache__' not in p.parts
             and p.suffix != '.pyc'}
  assert in_tree and in_tree == in_wheel
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
    requires = [line.split(':', 1)[1].strip()
                for line in z.read(meta).decode().splitlines()
                if line.startswith('Requires-Dist:') and 'extra' not in line]
  pairs = [_name_and_spec(r) for r in requires]
  # A list, not the dict's keys: a name required twice fails here too.
  assert sorted(name for name, _ in pairs) == [
      'absl-py', 'ml-dtypes', 'numpy', 'pillow', 'tensorflow']
  specs = dict(pairs)
  # ml_dtypes is TensorFlow's own dependency: the package only keeps out the
  # release whose import is slow (setup.cfg), it asks for nothing more.
  assert specs['ml-dtypes'] == '!=0.7.0'


def _name_and_spec(requirement):
  """('ml-dtypes', '!=0.7.0') of 'ml_dtypes != 0.7.0': the name as PEP 503
  normalises it (setuptools versions write either), the rest unspaced."""
  name = re.match(r'[A-Za-z0-9_.-]+', requirement).group(0)
  return (re.sub(r'[-_.]+', '-', name).lower(),
          requirement[len(name):].replace(' ', ''))


def test_installed_package_is_the_wheel_not_the_source_tree(venv, tmp_path):
  out = _run([str(venv / 'python'), '-c',
              'import deeplab_train; print(deeplab_train.__file__)'],
             tmp_path, _clean_env()).stdout.strip()
  assert out.startswith(str(venv.parent)), out
  assert not out.startswith(str(REPO)), out


def test_every_command_answers_help(venv, tmp_path):
  for command in COMMANDS:
    # Exit 0 (absl's own --help exits 1), the command's own text and flags.
    proc = _run([str(venv / command), '--help'], tmp_path, _clean_env())
    assert proc.stdout.startswith(command + ':'), proc.stdout[:200]
    assert '\nflags:\n' in proc.stdout and '--' in proc.stdout, command


def _small_voc_copy(dest, train=6, val=2):
  """A VOC-layout folder with the first few sample images of each split."""
  for sub in ('JPEGImages', 'SegmentationClass', 'ImageSets/Segmentation'):
    (dest / sub).mkdir(parents=True)
  for split, count in (('train', train), ('val', val)):
    ids = ['%s_%04d' % (split, i) for i in range(count)]
    (dest / 'ImageSets' / 'Segmentation' / (split + '.txt')).write_text(
        '\n'.join(ids) + '\n')
    for i in ids:
      shutil.copy(tt.SAMPLE / 'JPEGImages' / (i + '.jpg'),
                  dest / 'JPEGImages')
      shutil.copy(tt.SAMPLE / 'SegmentationClass' / (i + '.png'),
                  dest / 'SegmentationClass')


def _result_line(stdout):
  lines = [l for l in stdout.splitlines() if l.startswith('{')]
  assert lines, stdout
  return json.loads(lines[-1])


def test_end_to_end_from_the_installed_wheel(venv, tmp_path):
  """build-data, a few training steps, eval and export, outside the repo."""
  env = _clean_env()
  data = tmp_path / 'voc'
  _small_voc_copy(data)
  records, logdir = tmp_path / 'records', tmp_path / 'train'
  _run([str(venv / 'deeplab-build-data'), '--image_folder=%s' % (
      data / 'JPEGImages'), '--semantic_segmentation_folder=%s' % (
          data / 'SegmentationClass'), '--list_folder=%s' % (
              data / 'ImageSets' / 'Segmentation'),
        '--output_dir=%s' % records, '--dataset_name=shapes',
        '--num_classes=5', '--num_shards=1'], tmp_path, env)
  assert json.loads((records / 'dataset.json').read_text())[
      'num_classes'] == 5
  train = _run([str(venv / 'deeplab-train')]
               + tt.tiny_cli_args(logdir, records, 3), tmp_path, env)
  assert _result_line(train.stdout)['global_step'] == 3
  evaluation = _run([str(venv / 'deeplab-eval'),
                     '--checkpoint_dir=%s' % logdir,
                     '--dataset_dir=%s' % records, '--eval_split=val',
                     '--eval_logdir=%s' % (tmp_path / 'eval')], tmp_path, env)
  miou = _result_line(evaluation.stdout)['miou']
  assert 0.0 <= miou <= 1.0
  pb = tmp_path / 'export' / 'frozen_inference_graph.pb'
  _run([str(venv / 'deeplab-export'), '--checkpoint_path=%s' % logdir,
        '--export_path=%s' % pb, '--crop_size=65,65'], tmp_path, env)
  assert pb.stat().st_size > 10000
