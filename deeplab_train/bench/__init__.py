"""Training speed benchmark behind `deeplab-bench`.

For one model config, crop and batch, `run_benchmark` measures in one
process:

  (a) the input pipeline alone: images/s of `pipeline.make_dataset`;
  (b) training: images/s and seconds/step after warm-up, for the graph of
      `build_training_graph` fed by that pipeline;
  (c) FLOPs of one training step and the FLOP/s achieved;
  (d) the machine's fp32 dense peak, measured by a square matmul in the same
      run before and after training (the faster of the two), and the share
      of it that training achieves;
  (e) the process's peak resident memory (ru_maxrss);
  (f) the time the towers waited for input.

How (c) is counted: TensorFlow's profiler (`float_operation` options) sums
the FLOPs TensorFlow registers per op type on the static shapes of the
graph actually run: forward and backward of every tower, losses, optimizer.
It has no entry for the two depthwise-convolution gradients, which are
counted here from their shapes (2 * multiply-adds, as the profiler counts
convolutions). Counting the real graph, rather than an analytic formula of
the network, keeps the figure right for every backbone, decoder, tower
count and loss without a second model of the network to maintain.

How (f) is measured: a few extra steps are run with a full trace; the time
of the `IteratorGetNext` op of each traced step is the time the towers
waited for the pipeline (the op returns as soon as a prefetched batch is
ready), reported per step and as a share of the untraced step time (b).
A traced step takes 2 to 40 times longer, which gives the pipeline more
time to fill its buffer: the wait is a lower bound of an untraced step's.

`run_comparison` (bench/compare.py) instead trains the original DeepLab
trainer and deeplab-train alternately on the same records and flags and
compares their s/step and peak memory (for our own benchmarking).

The data is synthetic (VOC-sized JPEGs written to a temp folder), the
bundled sample dataset converted to a temp folder, or an existing TFRecord
folder; all go through the real input pipeline.
"""
from deeplab_train.bench.benchmark import BenchJob
from deeplab_train.bench.benchmark import BenchOptions
from deeplab_train.bench.benchmark import FLOP_COUNT_METHOD
from deeplab_train.bench.benchmark import RESULT_FIELDS
from deeplab_train.bench.benchmark import run_benchmark
from deeplab_train.bench.compare import CompareJob
from deeplab_train.bench.compare import CompareOptions
from deeplab_train.bench.compare import format_comparison
from deeplab_train.bench.compare import result_json_line
from deeplab_train.bench.compare import run_comparison
from deeplab_train.bench.compare import split_flag_args
from deeplab_train.bench.compare import TrainerFailed
from deeplab_train.bench.data import convert_sample_dataset
from deeplab_train.bench.data import SAMPLE_CLASSES
from deeplab_train.bench.data import SYNTHETIC_CLASSES
from deeplab_train.bench.data import write_synthetic_dataset
from deeplab_train.bench.measure import depthwise_gradient_flops
from deeplab_train.bench.measure import graph_flops
from deeplab_train.bench.measure import input_pipeline_rate
from deeplab_train.bench.measure import input_wait_seconds
from deeplab_train.bench.measure import matmul_peak_gflops
from deeplab_train.bench.measure import time_training
from deeplab_train.bench.report import format_table
from deeplab_train.bench.report import rounded
from deeplab_train.bench.report import variant_name
