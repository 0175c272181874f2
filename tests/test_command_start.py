"""What every deeplab-* command answers before TensorFlow loads.

Importing TensorFlow takes seconds. --help, a flag absl cannot parse and a
missing required flag need none of it, so a cron job with a typo, or a user
asking for help, gets the answer at once. Each case runs the command as its
console script does (setup.cfg's entry points) in a process of its own, and
the process reports at exit whether TensorFlow was imported.
"""
import configparser
import json
import subprocess
import sys

import pytest

import train_testing as tt

# Printed at exit by every process below: was TensorFlow imported?
_MARK = 'tensorflow imported: '
_PROBE = '''
import atexit, importlib, sys
atexit.register(lambda: sys.stderr.write(
    '%s%%s\\n' %% ('tensorflow' in sys.modules)))
module, function = sys.argv.pop(1).split(':')
sys.argv[0] = sys.argv.pop(1)
getattr(importlib.import_module(module), function)()
''' % _MARK


def _entry_points():
  """{command: 'module:function'} of setup.cfg's console scripts."""
  cfg = configparser.ConfigParser()
  cfg.read(tt.REPO / 'setup.cfg')
  lines = cfg['options.entry_points']['console_scripts'].strip().splitlines()
  return dict(tuple(part.strip() for part in line.split('='))
              for line in lines)


ENTRY_POINTS = _entry_points()
# Commands with a required flag (deeplab-build-data: its input folders,
# whose defaults are the original's VOC layout, missing here). deeplab-bench
# runs a benchmark of its defaults when given none.
NEEDS_A_FLAG = sorted(set(ENTRY_POINTS) - {'deeplab-bench'})


def _start(command, *args):
  proc = subprocess.run(
      [sys.executable, '-c', _PROBE, ENTRY_POINTS[command], command]
      + list(args), capture_output=True, text=True, env=tt.subprocess_env(),
      timeout=120)
  marks = [line for line in proc.stderr.splitlines()
           if line.startswith(_MARK)]
  assert marks, proc.stderr[-2000:]
  return proc, marks[-1] == _MARK + 'True'


def test_every_console_script_is_covered():
  assert sorted(ENTRY_POINTS) == [
      'deeplab-bench', 'deeplab-build-data', 'deeplab-eval',
      'deeplab-export', 'deeplab-stats', 'deeplab-train', 'deeplab-vis']


@pytest.mark.parametrize('command', sorted(ENTRY_POINTS))
def test_help_answers_without_tensorflow(command):
  proc, imported = _start(command, '--help')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.startswith(command + ':'), proc.stdout[:300]
  assert '\nflags:\n' in proc.stdout, proc.stdout[-2000:]
  assert not imported, '%s --help imported TensorFlow' % command


@pytest.mark.parametrize('command', sorted(ENTRY_POINTS))
def test_an_unknown_flag_exits_2_without_tensorflow(command):
  proc, imported = _start(command, '--no_such_flag=1')
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines()
            if 'no_such_flag' in line]
  assert errors and errors[0].startswith(command + ': '), proc.stderr
  assert not imported, '%s imported TensorFlow for a bad flag' % command


@pytest.mark.parametrize('command', NEEDS_A_FLAG)
def test_a_missing_required_flag_exits_2_without_tensorflow(command):
  proc, imported = _start(command)
  assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['status'] == 'bad_input', result
  # The message names the flag to give.
  assert '--' in result['message'], result
  assert not imported, '%s imported TensorFlow for a missing flag' % command
