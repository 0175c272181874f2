"""benchmarks/profile_step.py's reading of a Chrome trace: op time by kind
and the split of the step's wall time (no TensorFlow needed)."""
import json

import pytest


@pytest.fixture(scope='module')
def profile_step(benchmark_script):
  return benchmark_script('profile_step')


def _op(op, start_ms, end_ms):
  return {'ph': 'X', 'name': op, 'ts': start_ms * 1000,
          'dur': (end_ms - start_ms) * 1000, 'args': {'op': op, 'name': op}}


def test_wall_time_splits_into_matmul_other_and_idle(profile_step, tmp_path):
  # 0-10 a matmul, 5-12 another (overlapping), 8-15 batch norm (partly
  # beside them), nothing 15-20, 20-24 a ReLU alone.
  events = [_op('_MklMatMul', 0, 10), _op('_MklNativeConv2D', 5, 12),
            _op('FusedBatchNormV3', 8, 15), _op('Relu', 20, 24),
            {'ph': 'M', 'name': 'process_name', 'args': {'name': 'cpu'}}]
  path = tmp_path / 'timeline.json'
  path.write_text(json.dumps({'traceEvents': events}))

  summary = profile_step.summarize_trace(str(path))

  assert summary['wall_ms'] == pytest.approx(24.0)
  assert summary['op_ms'] == pytest.approx(10 + 7 + 7 + 4)
  assert summary['kinds']['conv / 1x1 matmul'] == pytest.approx(17.0)
  assert summary['kinds']['batch norm'] == pytest.approx(7.0)
  parts = summary['wall_parts']
  assert parts == pytest.approx({'a conv/matmul runs': 12.0,
                                 'only other ops run': 3.0 + 4.0,
                                 'no op runs': 5.0})
  table = profile_step.table([('deeplab-train', summary)])
  assert 'only other ops run' in table and '7.0 ms' in table


def _overlapping_trace(profile_step, tmp_path):
  """The summary of the events of the test above, one ReLU twice at once,
  and an event of no duration. 0-5 the matmul alone, 5-8 with the conv,
  8-10 the three, 10-12 conv and batch norm, 12-15 batch norm alone, 20-24
  two ReLUs."""
  events = [_op('_MklMatMul', 0, 10), _op('_MklNativeConv2D', 5, 12),
            _op('FusedBatchNormV3', 8, 15), _op('Relu', 20, 24),
            _op('Relu', 20, 24), _op('Const', 3, 3)]
  path = tmp_path / 'timeline.json'
  path.write_text(json.dumps({'traceEvents': events}))
  return profile_step.summarize_trace(str(path))


def test_wall_time_is_shared_among_the_ops_running(profile_step, tmp_path):
  summary = _overlapping_trace(profile_step, tmp_path)

  share = summary['wall_share']
  assert share == pytest.approx({'_MklMatMul': 5 + 1.5 + 2 / 3,
                                 '_MklNativeConv2D': 1.5 + 2 / 3 + 1,
                                 'FusedBatchNormV3': 2 / 3 + 1 + 3,
                                 'Relu': 4.0})
  assert sum(share.values()) == pytest.approx(
      summary['wall_ms'] - summary['wall_parts']['no op runs'])
  table = profile_step.table([('deeplab-train', summary)])
  assert 'share of the wall time' in table
  assert '_MklMatMul' in table.split('share of the wall time')[1]


def test_time_an_op_runs_alone(profile_step, tmp_path):
  # The matmul alone 0-5, batch norm alone 12-15; the two ReLUs 20-24 run
  # side by side, so neither is alone; 5-12 two or three ops run.
  summary = _overlapping_trace(profile_step, tmp_path)

  assert summary['alone'] == pytest.approx({'_MklMatMul': 5.0,
                                            'FusedBatchNormV3': 3.0})
  table = profile_step.table([('deeplab-train', summary)])
  alone = table.split('op types running alone')[1]
  assert '8.0 ms' in alone.splitlines()[0]
  assert alone.index('_MklMatMul') < alone.index('FusedBatchNormV3')
  assert 'Relu' not in alone


def test_covered_time_merges_nested_and_touching_spans(profile_step):
  assert profile_step.covered_ms([]) == 0.0
  assert profile_step.covered_ms(
      [(0, 4000), (1000, 2000), (4000, 5000), (7000, 8000)]) == 6.0
