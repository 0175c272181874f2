"""benchmarks/onednn_kernels.py's reading of ONEDNN_VERBOSE output: kernel
time a step from the difference of two runs (no TensorFlow run)."""
import pytest

# Both line formats oneDNN has printed, and lines to skip.
VERBOSE = '''\
onednn_verbose,info,oneDNN v3.2.0 (commit 04b180b9a58a78cf1a1cd2329671a5060c2be8de)
onednn_verbose,v1,primitive,create:cache_miss,cpu,matmul,brg:avx512_core_amx,undef,src_bf16::blocked:ab::f0,,,882x728:728x728,0.5
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src_bf16::blocked:ab::f0,,,882x728:728x728,1.25
onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src_bf16::blocked:ab::f0,,,882x728:728x728,0.75
onednn_verbose,exec,cpu,batch_normalization,bnorm_tbb_jit:avx512_core_bf16,backward,data_bf16::blocked:acdb::f0,,flags:CH,mb4ic960ih41iw41,3.5
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd::f0,,,728x1x1x3x3,not-a-number
I1205 06:01:12.035713 hooks.py:315] step 1/18  loss 3.2829
'''


@pytest.fixture(scope='module')
def kernels(benchmark_script):
  return benchmark_script('onednn_kernels')


def test_reads_exec_lines_of_both_formats(kernels):
  totals = kernels.parse_verbose(VERBOSE)
  matmul = kernels.Kernel('matmul', 'brg_matmul:avx10_1_512_amx', 'undef',
                          '882x728:728x728')
  bn = kernels.Kernel('batch_normalization', 'bnorm_tbb_jit:avx512_core_bf16',
                      'backward', 'mb4ic960ih41iw41')
  # The create line, the info line, the malformed time and the log line
  # are not kernel runs.
  assert totals == {matmul: [2.0, 2], bn: [3.5, 1]}


def test_a_step_is_the_difference_of_two_runs(kernels):
  short = kernels.parse_verbose(VERBOSE)
  long = kernels.parse_verbose(VERBOSE * 5)
  step = kernels.per_step(short, long, 2)
  by_primitive = kernels.by_primitive(step)
  assert by_primitive == {'matmul': (4.0, 4.0),
                          'batch_normalization': (7.0, 2.0)}
  with pytest.raises(ValueError, match='step counts must differ'):
    kernels.per_step(short, long, 0)


def test_kernels_of_one_run_only_count(kernels):
  """A kernel the short run did not run (a form taken later) counts whole;
  one only the short run ran (start-up) counts negative, as it is."""
  only_long = {kernels.Kernel('pooling', 'jit', 'forward', 'x'): [6.0, 3]}
  step = kernels.per_step({}, only_long, 3)
  assert step == {kernels.Kernel('pooling', 'jit', 'forward', 'x'):
                  (2.0, 1.0)}
  step = kernels.per_step(only_long, {}, 3)
  assert list(step.values()) == [(-2.0, -1.0)]


def test_table_shows_each_trainer_and_its_slowest_kernels(kernels):
  step = kernels.per_step({}, kernels.parse_verbose(VERBOSE), 1)
  text = kernels.table([('original', step, (0.9, 1.5)),
                        ('deeplab-train', {}, (0.4, 0.7))])
  lines = text.splitlines()
  assert lines[0].split() == ['a', 'step', 'original', 'deeplab-train']
  assert lines[1].split()[-4:] == ['0.900', 's', '0.400', 's']
  assert lines[2].split()[-4:] == ['1.500', 's', '0.700', 's']
  assert lines[3].split()[-4:] == ['5.5', 'ms', '0.0', 'ms']
  # Primitives by their time, the slowest first.
  assert lines[4].split()[0] == 'batch_normalization'
  assert lines[5].split()[0] == 'matmul'
  assert 'slowest kernels a step, original' in lines[6]
  assert lines[7].split()[:3] == ['3.50', '1.0', 'batch_normalization']
