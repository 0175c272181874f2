"""Speed options: session config (threads, XLA, mixed precision), bf16 / XLA
training steps on CPU, fp16 loss scaling, and the deeplab-bench command.

Over 400 lines on purpose: every speed option is checked twice, as a graph
rewrite (fast) and by a few training steps or a bench run (slow), and both
halves share the tiny records and option helpers at the top.
"""
import json
import os
import subprocess
import sys
import types
import time

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from deeplab_train import bench
from deeplab_train.bench import benchmark
from deeplab_train.bench import measure
from deeplab_train import config
from deeplab_train.config import PreprocessOptions
from deeplab_train.cli import bench as bench_cli
from deeplab_train.cli import train as train_cli
from deeplab_train.data import pipeline
from deeplab_train.data import preprocess
from deeplab_train.model import deeplab
from deeplab_train.train import graph as graph_lib
from deeplab_train.train import loss_scale as loss_scale_lib
from deeplab_train.runtime import cpu as cpu_lib
from deeplab_train.runtime import session_config as session_lib
import train_testing as tt

NUM_CLASSES = 3
CROP = 33
BATCH = 2


def _cpu_has_bf16():
  try:
    with open('/proc/cpuinfo') as f:
      text = f.read()
  except OSError:
    return False
  return 'avx512_bf16' in text or 'amx_bf16' in text


def _model_options():
  return config.ModelOptions(
      num_classes=NUM_CLASSES, model_variant='mobilenet_v2',
      crop_size=(CROP, CROP), output_stride=16,
      depth_multiplier=0.25).validate()


def _train_options(**changes):
  options = config.TrainOptions(
      train_batch_size=BATCH, base_learning_rate=0.1,
      training_number_of_steps=1000, fine_tune_batch_norm=False)
  return options.replace(**changes).validate()


def _fixed_batch_input_fn(seed=0):
  """The same learnable batch every step: the label is the image's
  brightest channel, in 16x16 tiles (the features are at stride 16)."""
  rng = np.random.RandomState(seed)
  tiles = rng.randint(0, NUM_CLASSES, (BATCH, CROP // 16 + 1, CROP // 16 + 1))
  labels = np.kron(tiles, np.ones((1, 16, 16), np.int64))[:, :CROP, :CROP]
  images = rng.uniform(0, 60, (BATCH, CROP, CROP, 3))
  for c in range(NUM_CLASSES):
    images[..., c] += 180 * (labels == c)
  images = images.astype(np.float32)
  labels = labels[..., None].astype(np.int32)

  def input_fn():
    return {'image': tf.constant(images), 'label': tf.constant(labels)}
  return input_fn


def _build(**train_changes):
  return graph_lib.build_training_graph(
      _model_options(), _train_options(**train_changes), ignore_label=255,
      input_fn=_fixed_batch_input_fn())


def _train_losses(g, session_config, steps, after=None, partitions=None):
  """Losses of `steps` steps; then after(sess) if given. With a list
  `partitions`, the graphs the first step ran (after rewrites and XLA
  clustering) are added to it: one session, so XLA compiles once."""
  with g.graph.as_default():
    init = [tf.global_variables_initializer(),
            tf.local_variables_initializer()]
  with tf.Session(graph=g.graph, config=session_config) as sess:
    sess.run(init)
    losses = []
    for step in range(steps):
      metadata = tf.RunMetadata()
      traced = step == 0 and partitions is not None
      losses.append(sess.run(
          [g.train_op, g.total_loss], run_metadata=metadata,
          options=tf.RunOptions(output_partition_graphs=traced))[1])
      if traced:
        partitions.extend(metadata.partition_graphs)
    if after is not None:
      after(sess)
  return losses


def _partition_dtypes(partitions):
  """{(op type, dtype name)} of graphs as rewritten by grappler."""
  found = set()
  for partition in partitions:
    for node in partition.node:
      if 'T' in node.attr:
        found.add((node.op, tf.as_dtype(node.attr['T'].type).name))
  return found


def _run_ops(partitions):
  """Op types of graphs as run."""
  return {n.op for p in partitions for n in p.node}


# ---------------------------------------------------------------------------
# Session config.
# ---------------------------------------------------------------------------
def test_session_config_defaults_use_every_core():
  cfg = session_lib.make_session_config()
  cores = session_lib.usable_cores()
  assert cfg.intra_op_parallelism_threads == cores
  assert cfg.inter_op_parallelism_threads == cores
  assert cfg.allow_soft_placement
  rewrite = cfg.graph_options.rewrite_options
  assert rewrite.auto_mixed_precision_onednn_bfloat16 == 0  # DEFAULT (off)
  assert rewrite.auto_mixed_precision == 0
  assert cfg.graph_options.optimizer_options.global_jit_level == 0
  # One grappler pass; no GPU-only memory rewrites on a CPU-only machine.
  rewriter = rewriter_config_pb2.RewriterConfig
  assert rewrite.meta_optimizer_iterations == rewriter.ONE
  assert rewrite.memory_optimization == (
      rewriter.DEFAULT_MEM_OPT if session_lib.gpus_visible()
      else rewriter.NO_MEM_OPT)


def test_session_config_settings():
  on = 1  # RewriterConfig.ON
  bf16 = session_lib.make_session_config('bf16', intra_op_threads=3,
                                         inter_op_threads=0)
  bf16_rewrite = bf16.graph_options.rewrite_options
  assert bf16_rewrite.auto_mixed_precision_onednn_bfloat16 == on
  assert bf16.intra_op_parallelism_threads == 3
  assert bf16.inter_op_parallelism_threads == 0
  fp16 = session_lib.make_session_config('fp16')
  assert fp16.graph_options.rewrite_options.auto_mixed_precision == on
  assert (fp16.graph_options.rewrite_options
          .auto_mixed_precision_onednn_bfloat16 != on)
  towers = session_lib.make_session_config(cpu_devices=2)
  assert towers.device_count['CPU'] == 2
  # XLA is marked in the graph, never session-wide (see test_xla_*).
  assert (towers.graph_options.optimizer_options.global_jit_level ==
          tf.OptimizerOptions.DEFAULT)


def test_session_config_rejects_bad_values():
  with pytest.raises(ValueError, match='mixed_precision'):
    session_lib.make_session_config('fp8')
  with pytest.raises(ValueError, match='thread'):
    session_lib.make_session_config(intra_op_threads=-1)


# ---------------------------------------------------------------------------
# bf16 and XLA training on CPU.
# ---------------------------------------------------------------------------
def test_bf16_rewrite_keeps_loss_fp32_and_loss_falls():
  g = _build(mixed_precision='bf16')
  config_bf16 = session_lib.make_session_config('bf16')
  partitions = []
  losses = _train_losses(g, config_bf16, 8, partitions=partitions)
  if session_lib.onednn_kernels_on():
    # The activations and their gradients ran compiled by XLA
    # (layers.activations_in_xla).
    assert '_XlaRun' in _run_ops(partitions)
  if _cpu_has_bf16():
    dtypes = _partition_dtypes(partitions)
    # 3x3 convolutions and the 1x1 ones (run as MatMul) both in bf16.
    conv_dtypes = {d for op, d in dtypes if 'Conv2D' in op}
    assert 'bfloat16' in conv_dtypes, dtypes
    matmul_dtypes = {d for op, d in dtypes if 'MatMul' in op}
    assert 'bfloat16' in matmul_dtypes, dtypes
    softmax = {d for op, d in dtypes if 'SoftmaxCrossEntropy' in op}
    assert softmax == {'float32'}, dtypes
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.95 * losses[0], losses


def test_xla_training_step_compiles_and_loss_falls():
  g = _build(use_xla=True)
  partitions = []
  losses = _train_losses(g, session_lib.make_session_config(), 6,
                         partitions=partitions)
  assert '_XlaRun' in _run_ops(partitions)
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.95 * losses[0], losses


def test_xla_leaves_the_input_pipeline_alone(tmp_path):
  # --use_xla marks the network and its gradients for compilation, not the
  # input pipeline (built under 'input/'), whose shapes change at run time;
  # a training step fed by the real pipeline runs.
  info = bench.write_synthetic_dataset(str(tmp_path), num_images=2,
                                       num_shards=1, size=(40, 50))
  preprocess_options = config.PreprocessOptions(
      crop_size=(CROP, CROP), min_scale_factor=0.5, max_scale_factor=2.0)

  def input_fn():
    dataset = pipeline.make_dataset(str(tmp_path), 'train', info,
                                    preprocess_options, BATCH,
                                    is_training=True, seed=1)
    return tf.data.make_one_shot_iterator(dataset).get_next()
  # The two-conv network: what is compiled is not the point here (the test
  # above compiles DeepLab), and XLA takes a minute over the tiny DeepLab.
  options = _model_options().replace(num_classes=info.num_classes)
  g = graph_lib.build_training_graph(
      options, _train_options(use_xla=True), ignore_label=255,
      input_fn=input_fn, model_fn=tt.toy_model_fn(info.num_classes),
      last_layer_scopes=['logits'])
  marked = [op.name for op in g.graph.get_operations()
            if '_XlaCompile' in op.node_def.attr]
  assert marked
  assert not [name for name in marked if name.startswith('input/')]
  partitions = []
  losses = _train_losses(g, session_lib.make_session_config(), 2,
                         partitions=partitions)
  run_ops = _run_ops(partitions)
  assert '_XlaRun' in run_ops and 'IteratorGetNext' in run_ops
  assert all(np.isfinite(losses))


def test_bf16_checkpoint_loads_into_fp32_eval_graph(tmp_path):
  g = _build(mixed_precision='bf16')
  prefix = str(tmp_path / 'model.ckpt')
  _train_losses(g, session_lib.make_session_config('bf16'), 2,
                after=lambda sess: g.saver.save(sess, prefix))
  dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
  model_names = {v.op.name for v in g.model_variables}
  assert model_names <= set(dtypes)
  assert {dtypes[n] for n in model_names} == {tf.float32}

  with tf.Graph().as_default():
    images = tf.constant(np.full((1, CROP, CROP, 3), 128.0, np.float32))
    labels = deeplab.predict_labels(images, _model_options())['semantic']
    restored = tf.global_variables()
    assert {v.op.name for v in restored} <= set(dtypes)
    saver = tf.train.Saver(restored)
    with tf.Session() as sess:
      saver.restore(sess, prefix)
      out = sess.run(labels)
  assert out.shape == (1, CROP, CROP)


# ---------------------------------------------------------------------------
# fp16 dynamic loss scaling.
# ---------------------------------------------------------------------------
def _ancestors(op):
  """The ops `op` depends on (its inputs', transitively, and itself)."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    if current not in seen:
      seen.add(current)
      todo.extend(t.op for t in current.inputs)
      todo.extend(current.control_inputs)
  return seen


def _loss_scale_graph(initial_scale=8.0, increment_period=2, **kw):
  graph = tf.Graph()
  with graph.as_default():
    step = tf.train.get_or_create_global_step()
    w = tf.get_variable('w', initializer=[1.0, 2.0])
    poison = tf.placeholder_with_default(False, [])
    scale = loss_scale_lib.DynamicLossScale(initial_scale, increment_period,
                                            **kw)
    grad = tf.gradients(scale.scale_loss(tf.reduce_sum(w * w)), [w])[0]
    grad = tf.where(poison, grad * np.inf, grad)
    scaled_grad = grad
    grads_and_vars = scale.unscale([(grad, w)])
    train_op = scale.apply_gradients(tf.train.MomentumOptimizer(0.1, 0.9),
                                     grads_and_vars, step)
    init = [tf.global_variables_initializer(),
            tf.local_variables_initializer()]
  return locals()


def test_loss_scale_unscales_gradients():
  t = _loss_scale_graph(initial_scale=8.0)
  with tf.Session(graph=t['graph']) as sess:
    sess.run(t['init'])
    scaled, unscaled = sess.run([t['scaled_grad'],
                                 t['grads_and_vars'][0][0]])
  np.testing.assert_allclose(scaled, 8.0 * np.array([2.0, 4.0]))
  np.testing.assert_allclose(unscaled, [2.0, 4.0])


def test_loss_scale_skips_non_finite_step_and_halves_scale():
  t = _loss_scale_graph(initial_scale=8.0, increment_period=2)
  state = lambda sess: sess.run([t['w'], t['step'], t['scale'].scale,
                                 t['scale'].good_steps])
  with tf.Session(graph=t['graph']) as sess:
    sess.run(t['init'])
    sess.run(t['train_op'])
    w1, step1, scale1, good1 = state(sess)
    assert (step1, scale1, good1) == (1, 8.0, 1)
    # A non-finite gradient: no update (weights, momentum, step), scale / 2.
    momentum = t['graph'].get_tensor_by_name('w/Momentum:0')
    m1 = sess.run(momentum)
    sess.run(t['train_op'], {t['poison']: True})
    w2, step2, scale2, good2 = state(sess)
    np.testing.assert_array_equal(w2, w1)
    np.testing.assert_array_equal(sess.run(momentum), m1)
    assert (step2, scale2, good2) == (1, 4.0, 0)
    # Two finite steps in a row (the period): applied, then the scale grows.
    sess.run(t['train_op'])
    assert state(sess)[1:] == [2, 4.0, 1]
    sess.run(t['train_op'])
    assert state(sess)[1:] == [3, 8.0, 0]


def test_loss_scale_never_below_minimum_where_it_diverged():
  """Non-finite gradients at the smallest scale, step after step: they were
  skipped for ever, without a word (a run without a time budget never
  ended). So many in a row are `diverged`, which the trainer's non-finite
  guard stops on; fewer (a rare batch) are skipped as any other."""
  t = _loss_scale_graph(initial_scale=2.0, diverged_steps=2)
  scale = t['scale']
  with tf.Session(graph=t['graph']) as sess:
    sess.run(t['init'])
    diverged = []
    for poison in (True, True, False, True, True, False):
      diverged.append(sess.run([t['train_op'], scale.diverged],
                               {t['poison']: poison})[1])
    # At 2.0, then 1.0 (one), a finite step, two at 1.0 in a row.
    assert diverged == [False, False, False, False, True, False]
    assert sess.run(scale.scale) == 1.0
    assert sess.run(t['step']) == 2


def test_loss_scale_variables_are_not_checkpointed():
  t = _loss_scale_graph()
  with t['graph'].as_default():
    saved = {v.op.name for v in tf.global_variables()}
  assert not any('loss_scale' in name for name in saved), saved
  with pytest.raises(ValueError, match='loss scale'):
    with tf.Graph().as_default():
      loss_scale_lib.DynamicLossScale(initial_scale=0.5)


def test_fp16_training_graph_scales_loss_and_trains_on_cpu():
  g = _build(mixed_precision='fp16')
  scale = g.loss_scale
  assert scale is not None
  # The guard's check takes the loss scale's divergence in.
  assert scale.diverged.op in _ancestors(g.all_finite.op)
  with g.graph.as_default():
    saved = {v.op.name for v in tf.global_variables()}
  assert not any(name.startswith('loss_scale') for name in saved)
  # On a CPU the fp16 rewrite is skipped (no GPU); the scaling still runs.
  scales = []
  losses = _train_losses(g, session_lib.make_session_config('fp16'), 6,
                         after=lambda sess: scales.append(
                             sess.run(scale.scale)))
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.95 * losses[0], losses
  assert scales == [loss_scale_lib.DEFAULT_INITIAL_SCALE]  # no step skipped


def test_fp16_refused_with_a_wrapped_optimizer():
  """A cluster task's run refuses fp16 before any graph, as bad input
  (tests/test_distributed.py); the graph never builds it."""
  with pytest.raises(ValueError, match='fp16'):
    graph_lib.build_training_graph(
        _model_options(), _train_options(mixed_precision='fp16'),
        ignore_label=255, input_fn=_fixed_batch_input_fn(),
        wrap_optimizer=lambda optimizer: optimizer)


def test_train_options_validate_speed_fields():
  with pytest.raises(config.ConfigError, match='mixed_precision'):
    _train_options(mixed_precision='fp8')
  with pytest.raises(config.ConfigError, match='intra_op'):
    _train_options(intra_op_parallelism_threads=-2)
  options = _train_options(mixed_precision='bf16', use_xla=True,
                           intra_op_parallelism_threads=1,
                           inter_op_parallelism_threads=0)
  cfg = session_lib.from_train_options(options)
  rewrite = cfg.graph_options.rewrite_options
  assert rewrite.auto_mixed_precision_onednn_bfloat16 == 1
  assert (cfg.intra_op_parallelism_threads,
          cfg.inter_op_parallelism_threads) == (1, 0)


def test_deeplab_train_flags_reach_the_options():
  with flagsaver.flagsaver():
    flags.FLAGS(['deeplab-train', '--mixed_precision=bf16', '--use_xla',
                 '--intra_op_parallelism_threads=2'])
    options = train_cli.train_options()
  assert options.mixed_precision == 'bf16'
  assert options.use_xla
  assert options.intra_op_parallelism_threads == 2
  assert options.inter_op_parallelism_threads is None


# ---------------------------------------------------------------------------
# The fused scale + pad + crop of the training pipeline.
# ---------------------------------------------------------------------------
def _reference_scale_pad_crop(image, label, scale, crop, mean, ignore, seed,
                              flip=False):
  """Scale the whole image, pad, crop, flip: the unfused steps."""
  image, label = preprocess.scale_image_and_label(
      tf.cast(image, tf.float32), tf.cast(label, tf.int32), scale)
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  target_h = tf.maximum(height, crop[0])
  target_w = tf.maximum(width, crop[1])
  image = preprocess.pad_to_size(image, target_h, target_w,
                                 tf.reshape(tf.constant(mean), [1, 1, 3]))
  label = preprocess.pad_to_size(label, target_h, target_w, ignore)
  image, label = preprocess.random_crop(image, label, crop[0], crop[1], seed)
  if flip:
    image, label = tf.reverse(image, [1]), tf.reverse(label, [1])
  return image, label


@pytest.mark.parametrize('size,crop,scale', [
    ((60, 90), (33, 33), 1.75),   # scaled image larger: window path
    ((47, 35), (33, 65), 1.25),   # partly padded
    ((20, 26), (33, 33), 0.5),    # smaller than the crop: whole-image path
    ((41, 33), (33, 33), 1.0),    # python float 1.0
    ((1, 40), (33, 33), 1.5),     # one row
])
def test_fused_scale_pad_crop_equals_unfused(size, crop, scale):
  rng = np.random.RandomState(sum(size))
  image = tf.constant(rng.randint(0, 256, size + (3,)).astype(np.uint8))
  label = tf.constant(rng.randint(0, 5, size + (1,)).astype(np.uint8))
  for i in range(8):
    # Per-channel and single-value padding, flipped and not.
    mean = (123.15, 115.9, 103.06) if i % 4 < 2 else (127.5,) * 3
    flip = i % 2 == 1
    seed = tf.constant([i, 7])
    scale_t = scale if scale == 1.0 else tf.constant(scale)
    want = _reference_scale_pad_crop(image, label, scale_t, crop, mean, 255,
                                     seed, flip)
    got = preprocess.scale_pad_and_crop(image, label, scale_t, crop[0],
                                        crop[1], mean, 255, seed,
                                        flip=tf.constant(flip))
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    assert got[0].dtype == tf.float32 and got[1].dtype == tf.int32


def test_fused_window_path_matches_on_random_scales():
  # Many scales and windows through the window path only (the larger
  # images), in a graph as the pipeline runs it.
  rng = np.random.RandomState(3)
  cases = []
  with tf.Graph().as_default():
    for i in range(12):
      size = (int(rng.randint(40, 120)), int(rng.randint(40, 120)))
      image = tf.constant(rng.randint(0, 256, size + (3,)).astype(np.uint8))
      label = tf.constant(rng.randint(0, 21, size + (1,)).astype(np.uint8))
      scale = tf.constant(float(rng.uniform(0.9, 2.0)))
      seed = tf.constant([i, 1])
      flip = bool(i % 2)
      cases.append((
          preprocess.scale_pad_and_crop(image, label, scale, 33, 41,
                                        (127.5,) * 3, 255, seed,
                                        flip=tf.constant(flip)),
          _reference_scale_pad_crop(image, label, scale, (33, 41),
                                    (127.5,) * 3, 255, seed, flip)))
    with tf.Session() as sess:
      for got, want in sess.run(cases):
        # Graph rewrites may fuse the float ops differently (1 ulp).
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(got[1], want[1])


def test_pad_to_size_left_and_per_channel():
  tensor = tf.reshape(tf.range(6, dtype=tf.float32), [1, 2, 3])
  right = preprocess.pad_to_size(tensor, 2, 3, (9.0, 9.0, 9.0)).numpy()
  left = preprocess.pad_to_size(tensor, 2, 3, 9.0,
                                pad_left=tf.constant(True)).numpy()
  np.testing.assert_array_equal(right[0, :2], tensor[0].numpy())
  np.testing.assert_array_equal(left[0, 1:], tensor[0].numpy())
  assert (right[0, 2] == 9).all() and (left[0, 0] == 9).all()
  assert (right[1] == 9).all() and (left[1] == 9).all()
  channels = preprocess.pad_to_size(tensor, 1, 3, (1.5, 2.5, 3.5)).numpy()
  np.testing.assert_array_equal(channels[0, 2], [1.5, 2.5, 3.5])


def test_training_preprocess_flips_the_same_as_before_the_fusion():
  # The pipeline's one call (scale, crop and flip fused) against the
  # separate steps driven by the same seeds: half of the seeds flip.
  rng = np.random.RandomState(5)
  image = tf.constant(rng.randint(0, 256, (90, 70, 3)).astype(np.uint8))
  label = tf.constant(rng.randint(0, 21, (90, 70, 1)).astype(np.uint8))
  options = PreprocessOptions(crop_size=(33, 33), min_scale_factor=0.5,
                              max_scale_factor=2.0,
                              scale_factor_step_size=0.25)
  flips = 0
  for i in range(10):
    seed = tf.constant([i, 3], tf.int64)
    _, got_image, got_label = preprocess.preprocess_image_and_label(
        image, label, options, seed=seed)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    scale = preprocess.random_scale_factor(0.5, 2.0, 0.25, seeds[0])
    flip = bool(preprocess.random_flip_decision(seeds[2]))
    flips += flip
    want = _reference_scale_pad_crop(image, label, scale, (33, 33),
                                     (127.5,) * 3, 255, seeds[1], flip)
    np.testing.assert_array_equal(got_image.numpy(), want[0].numpy())
    np.testing.assert_array_equal(got_label.numpy(), want[1].numpy())
  assert 0 < flips < 10


# ---------------------------------------------------------------------------
# Benchmark pieces and the command.
# ---------------------------------------------------------------------------
def test_flop_count_includes_depthwise_gradients():
  with tf.Graph().as_default() as graph:
    x = tf.zeros([1, 8, 8, 4])
    w = tf.get_variable('w', [3, 3, 4, 1])
    y = tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], 'SAME')
    tf.gradients(tf.reduce_sum(y), [x, w])
  # Forward 2*8*8*4*9 = 4608; each gradient costs the same.
  assert bench.depthwise_gradient_flops(graph) == 2 * 4608
  assert bench.graph_flops(graph) >= 3 * 4608


def test_input_wait_reads_iterator_time():
  metadata = tf.RunMetadata()
  device = metadata.step_stats.dev_stats.add()
  device.node_stats.add(node_name='input/IteratorGetNext',
                        all_end_rel_micros=1500)
  device.node_stats.add(node_name='tower_0/conv', all_end_rel_micros=9000)
  assert bench.input_wait_seconds(metadata) == pytest.approx(0.0015)


def test_synthetic_dataset_feeds_the_pipeline(tmp_path):
  info = bench.write_synthetic_dataset(str(tmp_path), num_images=4,
                                       num_shards=2)
  rate = bench.input_pipeline_rate(
      lambda: pipeline.make_dataset(
          str(tmp_path), 'train', info,
          config.PreprocessOptions(crop_size=(CROP, CROP)), 2,
          is_training=True), 2, batches=2, warmup_batches=1)
  assert rate > 0


def _run_bench(args, tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  cmd = [sys.executable, '-m', 'deeplab_train.cli.bench',
         '--model_variant=mobilenet_v2', '--depth_multiplier=0.25',
         '--train_crop_size=%d,%d' % (CROP, CROP), '--train_batch_size=2',
         '--bench_synthetic_images=4', '--bench_steps=2',
         '--bench_warmup_steps=1', '--bench_trace_steps=1',
         '--bench_input_batches=2', '--bench_matmul_size=128',
         '--bench_json=%s' % (tmp_path / 'bench.json')] + args
  return subprocess.run(cmd, capture_output=True, text=True, env=env,
                        timeout=300, check=False)


def test_bench_keeps_the_faster_of_the_peaks_before_and_after(monkeypatch):
  # A load during the first measurement (86) must not make the share of
  # the peak look larger than it is: the figure after the steps wins.
  peaks = iter([86.0, 90.0, 130.0, 80.0])  # fp32, bf16 before; after
  monkeypatch.setattr(measure, 'matmul_peak_gflops',
                      lambda *args: next(peaks))
  monkeypatch.setattr(measure, 'input_pipeline_rate', lambda *args: 100.0)
  monkeypatch.setattr(measure, 'graph_flops', lambda graph: 2.6e9)
  monkeypatch.setattr(measure, 'time_training', lambda *args: (
      measure.TrainingTimes(seconds_per_step=0.1, first_step_seconds=1.0,
                            cores_used=2.0, input_wait_seconds_per_step=None,
                            input_wait_fraction=None, first_loss=1.0,
                            last_loss=0.9)))
  job = benchmark.BenchJob(
      model_options=_model_options(), train_options=_train_options(),
      preprocess_options=None, dataset_dir='', dataset_info=None, split='',
      data='synthetic', mixed_precision='none', use_xla=False,
      session_config=None, peak_session_config=None,
      build_graph=lambda input_fn: types.SimpleNamespace(
          graph=None, train_op=None, total_loss=None, scaffold=None))

  result = benchmark.run_benchmark(job, bench.BenchOptions())

  assert (result['peak_gflops'], result['peak_bf16_gflops']) == (130.0, 90.0)
  assert result['achieved_gflops'] == pytest.approx(26.0)
  assert result['peak_fraction'] == pytest.approx(26.0 / 130.0)


def test_bench_names_a_damaged_record(tmp_path, monkeypatch):
  """deeplab-bench --bench_data=dataset_dir on a damaged shard printed
  TensorFlow's 20-line graph error ('corrupted record at 9815'), naming no
  file; deeplab-train names the file and the record."""
  info = tt.make_tfrecords(tmp_path / 'records', count=3)
  shard, = (tmp_path / 'records').glob('train-*.tfrecord')
  sizes = [len(r) + 16 for r in tf.io.tf_record_iterator(str(shard))]
  data = bytearray(shard.read_bytes())
  middle = sizes[0] + 12 + 100  # inside the second record's data
  data[middle:middle + 64] = bytes(64)
  shard.write_bytes(bytes(data))
  monkeypatch.setattr(measure, 'matmul_peak_gflops', lambda *args: 100.0)
  job = benchmark.BenchJob(
      model_options=_model_options(), train_options=_train_options(),
      preprocess_options=PreprocessOptions(crop_size=(CROP, CROP)),
      dataset_dir=str(tmp_path / 'records'), dataset_info=info,
      split='train', data='dataset_dir', mixed_precision='none',
      use_xla=False, session_config=None, peak_session_config=None,
      build_graph=None)
  with pytest.raises(config.ConfigError) as error:
    benchmark.run_benchmark(job, bench.BenchOptions())
  assert str(error.value) == (
      'corrupted TFRecord input: %s: record 1 (byte offset %d) is damaged '
      'or cut short; convert the data again with deeplab-build-data'
      % (shard, sizes[0]))


def test_bench_command_prints_table_and_json(tmp_path):
  proc = _run_bench(['--mixed_precision=bf16'], tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [json.loads(l) for l in proc.stdout.splitlines()
           if l.startswith('{')]
  assert len(lines) == 1
  assert (lines[0]['event'], lines[0]['status']) == ('result', 'ok')
  assert len(lines[0]['results']) == 1
  result = lines[0]['results'][0]
  assert set(result) == set(bench.RESULT_FIELDS)
  assert result['mixed_precision'] == 'bf16'
  assert result['crop_size'] == [CROP, CROP]
  for key in ('train_images_per_sec', 'input_images_per_sec',
              'gflop_per_step', 'achieved_gflops', 'peak_gflops',
              'peak_fraction', 'peak_rss_gib', 'cores_used'):
    assert result[key] > 0, key
  assert 0 <= result['input_wait_fraction'] <= 1
  assert np.isfinite(result['last_loss'])
  assert 'share of fp32 peak' in proc.stdout
  # A tiny model's count read '0.0 GFLOP'.
  assert ('FLOPs / step  %.4g GFLOP' % result['gflop_per_step']).split() == [
      w for l in proc.stdout.splitlines() if l.startswith('FLOPs / step')
      for w in l.split()]
  written = (tmp_path / 'bench.json').read_text().splitlines()
  assert [json.loads(l) for l in written] == lines[0]['results']


def _fake_result(mode, xla, images_per_sec):
  result = dict.fromkeys(bench.RESULT_FIELDS, 1.0)
  result.update(model_variant='mobilenet_v2', output_stride=8,
                crop_size=[321, 321], batch_size=4, num_clones=1,
                fine_tune_batch_norm=True, data='synthetic',
                mixed_precision=mode, use_xla=xla,
                train_images_per_sec=images_per_sec, load_average=[0.5, 0.6])
  return result


def test_bench_variants_run_in_child_processes(monkeypatch):
  commands = []

  def fake_run(argv, **unused_kwargs):
    commands.append(argv)
    mode = [a for a in argv if a.startswith('--mixed_precision=')][0]
    mode = mode.split('=')[1]
    result = _fake_result(mode, '--use_xla' in argv, 4.0 if mode == 'none'
                          else 8.0)
    line = {'event': 'result', 'status': 'ok', 'results': [result]}
    return subprocess.CompletedProcess(
        argv, 0, 'noise\n%s\n' % json.dumps(line), '')

  monkeypatch.setattr(bench_cli.subprocess, 'run', fake_run)
  with flagsaver.flagsaver():
    flags.FLAGS(['deeplab-bench', '--output_stride=8', '--atrous_rates=6',
                 '--atrous_rates=12', '--bench_variants=none,bf16+xla'])
    results = bench_cli.run_variants(bench_cli.options_from_flags())
  assert [(r['mixed_precision'], r['use_xla']) for r in results] == [
      ('none', False), ('bf16', True)]
  first, second = commands
  assert '--output_stride=8' in first and '--bench_child' in first
  assert first.count('--atrous_rates=6') == 1
  assert '--atrous_rates=12' in first
  assert not any(a.startswith('--bench_variants') for a in first)
  assert '--mixed_precision=none' in first and '--nouse_xla' in first
  assert '--mixed_precision=bf16' in second and '--use_xla' in second
  table = bench.format_table(results)
  assert 'bf16+xla' in table and '2.00x' in table


def test_bench_says_when_dataset_dir_is_not_read(caplog):
  with flagsaver.flagsaver():
    flags.FLAGS(['deeplab-bench', '--dataset_dir=/data/voc'])
    assert bench_cli._num_classes_and_info() == (bench.SYNTHETIC_CLASSES,
                                                 None)
  assert '--dataset_dir=/data/voc is not read' in caplog.text
  assert '--bench_data=dataset_dir' in caplog.text
  caplog.clear()
  with flagsaver.flagsaver():
    flags.FLAGS(['deeplab-bench', '--bench_data=sample'])
    bench_cli._num_classes_and_info()
  assert 'dataset_dir' not in caplog.text


def test_bench_variant_names():
  assert bench_cli.parse_variant('none') == ('none', False)
  assert bench_cli.parse_variant('fp32+xla') == ('none', True)
  assert bench_cli.parse_variant('bf16+xla') == ('bf16', True)
  assert bench_cli.parse_variant('xla') == ('none', True)
  for bad in ('fp8', 'bf16+fp16', 'xla+xla', 'auto+bf16'):
    with pytest.raises(config.ConfigError, match='bench_variants'):
      bench_cli.parse_variant(bad)


@pytest.mark.parametrize('flags_line,mode', [
    ('flags\t\t: avx2 avx512f avx512_bf16', 'bf16'),
    ('flags\t\t: avx2 amx_tile amx_bf16', 'bf16'),
    ('flags\t\t: avx2 avx512f', 'none')])
def test_bench_variant_auto_is_what_training_chooses(flags_line, mode):
  features = cpu_lib.cpu_features('processor\t: 0\n' + flags_line)
  assert bench_cli.parse_variant('auto', features) == (mode, False)
  assert bench_cli.parse_variant('auto+xla', features) == (mode, True)
  chosen, reason = cpu_lib.auto_mixed_precision(features)
  assert chosen == mode
  # Where bf16 is chosen the log says how to measure its gain here, and
  # what it gained on a CPU of the same kind.
  assert ('--bench_variants=none,auto' in reason) == (mode == 'bf16')
  if mode == 'bf16':
    amx = 'amx' in flags_line
    assert ('on a Xeon with AMX' in reason) == amx
    assert ('on an AMD EPYC with AVX512_BF16' in reason) == (not amx)


def _run_variants(monkeypatch, cpu_flags, variants):
  """(results, child command lines) of run_variants on a CPU with
  `cpu_flags`, with oneDNN on and uncapped, and children faked."""
  commands = []

  def fake_run(argv, **unused_kwargs):
    commands.append(argv)
    mode = [a for a in argv if a.startswith('--mixed_precision=')][0]
    result = _fake_result(mode.split('=')[1], False, 4.0)
    line = {'event': 'result', 'status': 'ok', 'results': [result]}
    return subprocess.CompletedProcess(argv, 0, json.dumps(line) + '\n', '')

  monkeypatch.setattr(bench_cli.subprocess, 'run', fake_run)
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: cpu_lib.cpu_features(
      'processor\t: 0\nflags\t\t: ' + cpu_flags))
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  for name in cpu_lib.ONEDNN_ISA_ENVS:
    monkeypatch.delenv(name, raising=False)
  with flagsaver.flagsaver():
    flags.FLAGS(['deeplab-bench', '--bench_variants=' + variants])
    return bench_cli.run_variants(bench_cli.options_from_flags()), commands


def test_bench_variants_measure_a_setting_once(monkeypatch):
  # Where auto is none (no native bf16), none,auto runs one child.
  results, commands = _run_variants(monkeypatch, 'avx2', 'none,auto,bf16')
  assert [r['mixed_precision'] for r in results] == ['none', 'none', 'bf16']
  assert len(commands) == 2
  assert dict(results[1], bench_variant='none') == results[0]
  # The table's columns were 'fp32 fp32 bf16', and the JSON lines did not
  # say which setting each came from.
  assert [r['bench_variant'] for r in results] == ['none', 'auto', 'bf16']
  assert [bench.variant_name(r) for r in results] == [
      'fp32', 'auto (fp32)', 'bf16']


_BF16_CPU = 'processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16'


def test_onednn_isa_cap_is_read_as_onednn_reads_it():
  cap = cpu_lib.onednn_isa_cap
  assert cap({}) is None
  assert cap({'ONEDNN_MAX_CPU_ISA': 'avx2'}) == ('ONEDNN_MAX_CPU_ISA', 'avx2',
                                                 3)
  assert cap({'DNNL_MAX_CPU_ISA': 'AVX512_CORE'})[:2] == ('DNNL_MAX_CPU_ISA',
                                                         'AVX512_CORE')
  # The first one set wins, and ALL or an unknown name caps nothing.
  assert cap({'ONEDNN_MAX_CPU_ISA': 'ALL', 'DNNL_MAX_CPU_ISA': 'AVX2'}) is None
  assert cap({'ONEDNN_MAX_CPU_ISA': 'avx9'}) is None
  assert cpu_lib.onednn_limit({'ONEDNN_MAX_CPU_ISA': 'avx2'}) == (
      'capped at AVX2 (ONEDNN_MAX_CPU_ISA)')
  assert cpu_lib.onednn_limit({'TF_ENABLE_ONEDNN_OPTS': 'false'}) == (
      'off (TF_ENABLE_ONEDNN_OPTS=0)')
  assert cpu_lib.onednn_limit({'TF_ENABLE_ONEDNN_OPTS': '1'}) is None


@pytest.mark.parametrize('environ,mode,named', [
    ({}, 'bf16', None),
    ({'TF_ENABLE_ONEDNN_OPTS': '1'}, 'bf16', None),
    ({'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_BF16'}, 'bf16', None),
    ({'ONEDNN_MAX_CPU_ISA': 'avx512_core_amx'}, 'bf16', None),
    # No bf16 rewrite with oneDNN off; bf16 measured slower below bf16.
    ({'TF_ENABLE_ONEDNN_OPTS': '0'}, 'none', 'TF_ENABLE_ONEDNN_OPTS=0'),
    ({'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'}, 'none',
     'ONEDNN_MAX_CPU_ISA=AVX512_CORE'),
    ({'DNNL_MAX_CPU_ISA': 'AVX2'}, 'none', 'DNNL_MAX_CPU_ISA=AVX2')])
def test_auto_is_bf16_only_where_onednn_may_use_native_bf16(environ, mode,
                                                            named):
  features = cpu_lib.cpu_features(_BF16_CPU)
  chosen, reason = cpu_lib.auto_mixed_precision(features, environ)
  assert chosen == mode
  if named:
    assert named in reason and 'native bfloat16 (AVX512_BF16), but' in reason


def test_onednn_amx_only_where_onednn_may_use_the_tiles():
  amx = cpu_lib.cpu_features(_BF16_CPU + ' amx_tile amx_bf16')
  assert cpu_lib.onednn_amx(amx, {})
  for cap in ('AVX512_CORE_AMX', 'avx10_1_512_amx_fp16', 'ALL'):
    assert cpu_lib.onednn_amx(amx, {'ONEDNN_MAX_CPU_ISA': cap}), cap
  for environ in ({'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_BF16'},
                  {'DNNL_MAX_CPU_ISA': 'AVX2'},
                  {'TF_ENABLE_ONEDNN_OPTS': '0'}):
    assert not cpu_lib.onednn_amx(amx, environ), environ
  assert not cpu_lib.onednn_amx(cpu_lib.cpu_features(_BF16_CPU), {})


def test_bf16_is_refused_where_onednn_would_abort(monkeypatch):
  avx512 = cpu_lib.cpu_features(_BF16_CPU)
  avx2 = cpu_lib.cpu_features('processor\t: 0\nflags\t\t: avx2')
  capped = {'ONEDNN_MAX_CPU_ISA': 'AVX2'}
  refusal = cpu_lib.bf16_refusal(avx512, capped)
  assert 'ONEDNN_MAX_CPU_ISA=AVX2' in refusal
  assert refusal.endswith('or train in float32')
  # Runs (slowly) at AVX512_CORE; no oneDNN bf16 without AVX-512 or with
  # oneDNN off.
  assert cpu_lib.bf16_refusal(avx512, {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'}) \
      is None
  assert cpu_lib.bf16_refusal(avx2, capped) is None
  assert cpu_lib.bf16_refusal(avx512, {}) is None
  # With oneDNN off the bfloat16 rewrite (its pass) does not happen: a bf16
  # run trained float32 to the bit, saying bf16 in deeplab_config.json.
  for cpu in (avx512, avx2):
    off = cpu_lib.bf16_refusal(cpu, dict(capped, TF_ENABLE_ONEDNN_OPTS='0'))
    assert off.startswith('TF_ENABLE_ONEDNN_OPTS=0 turns TensorFlow\'s '
                          'oneDNN kernels off, and with them the bfloat16 '
                          'rewrite: the run would train in float32')
  # deeplab-bench refuses it before starting a child.
  monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX2')
  monkeypatch.delenv('DNNL_MAX_CPU_ISA', raising=False)
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  with pytest.raises(config.ConfigError,
                     match=r'--bench_variants: bf16\+xla: ONEDNN_MAX_CPU_ISA'):
    bench_cli.parse_variant('bf16+xla', avx512)
  assert bench_cli.parse_variant('auto', avx512) == ('none', False)
  assert bench_cli.parse_variant('bf16', avx2) == ('bf16', False)
  # And an fp32 benchmark there measures no bf16 matmul peak, which would
  # abort the process too; it does elsewhere.
  measured = []
  monkeypatch.setattr(measure, 'matmul_peak_gflops',
                      lambda size, runs, dtype, config: measured.append(dtype)
                      or 1.0)
  job = types.SimpleNamespace(peak_session_config=None)
  for features, peaks in ((avx512, (1.0, None)), (avx2, (1.0, 1.0))):
    monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda f=features: f)
    del measured[:]
    assert benchmark._matmul_peaks(job, bench.BenchOptions()) == peaks
    assert measured == [tf.float32] + [tf.bfloat16] * (peaks[1] is not None)
  # With oneDNN off a bfloat16 matmul runs (only the training rewrite is
  # off): its peak is measured, where the refusal of bf16 training took it.
  monkeypatch.setattr(cpu_lib, 'machine_cpu', lambda: avx512)
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '0')
  assert cpu_lib.bf16_refusal(avx512) and not cpu_lib.bf16_abort(avx512)
  assert benchmark._matmul_peaks(job, bench.BenchOptions()) == (1.0, 1.0)


def test_bench_variants_auto_runs_the_machines_choice(monkeypatch):
  results, commands = _run_variants(
      monkeypatch, 'avx2 avx512f avx512_bf16', 'none,auto')
  assert [r['mixed_precision'] for r in results] == ['none', 'bf16']
  assert '--mixed_precision=bf16' in commands[1]
  # The bf16 step's FLOP/s is also given as a share of the bf16 peak.
  for r in results:
    r.update(achieved_gflops=200.0, peak_gflops=250.0,
             peak_bf16_gflops=400.0)
  row = [l for l in bench.format_table(results).splitlines()
         if l.startswith('share of bf16 peak')][0]
  assert row.split()[4:] == ['-', '50.0', '%']


def test_input_wait_share_is_of_the_step_the_table_shows(monkeypatch):
  """The share was of the traced steps' time, 2 to 40 times the step time
  printed beside it: 0.0058 s of wait in a 0.028 s step showed as 0.47 %."""
  monkeypatch.setattr(measure, 'input_wait_seconds', lambda metadata: 0.002)
  graph = tf.Graph()
  with graph.as_default():
    counter = tf.get_variable('n', [], initializer=tf.zeros_initializer())
    loss = tf.identity(counter)
    # A step of about 10 ms: the share is not capped at 1.
    nap = tf.py_function(lambda: time.sleep(0.01) or 0., [], tf.float32)
    train_op = tf.assign_add(counter, nap + 1.)
  options = bench.BenchOptions(warmup_steps=1, steps=5, trace_steps=2)
  times = measure.time_training(graph, train_op, loss, tf.ConfigProto(),
                                options)
  assert times.input_wait_seconds_per_step == pytest.approx(0.002)
  assert times.seconds_per_step > 0.008
  assert times.input_wait_fraction == pytest.approx(
      0.002 / times.seconds_per_step)
