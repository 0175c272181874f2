#!/usr/bin/env python3
"""A training step with and without one of the forms the training towers
build (most of them where oneDNN's CPU kernels run), both graphs in one
process, steps alternated.

    python benchmarks/onednn_forms_step.py --form=dilation [--rounds=8] \\
        [--steps=3] -- --model_variant=mobilenet_v2 --output_stride=8 \\
           --train_crop_size=321,321 --train_batch_size=4 \\
           --fine_tune_batch_norm=true

--form is one of FORMS: 'dilation', dilated depthwise convolutions in one
op (layers.dilated_depthwise_in_one_op), 'filter_gradient', the filter
gradient of large stride-1 convolutions as a matmul over patches
(layers.filter_gradient_as_matmul), or 'pooling_projection', ASPP's image
pooling branch projected once per image
(layers.broadcast_input_projected_once, built on every device). The flags
after `--` are deeplab-bench's (the model and training flags of
deeplab-train). Builds the training graph twice on one constant random
batch: as the towers build it, and with that form turned off (its context
entered as disabled). Then runs --rounds rounds of --steps steps of
each, alternating which goes first, and prints each round's median
s/step and the medians over all steps. One process, so both graphs see
the same machine state: steadier than separate runs on a shared 2-core
machine.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from deeplab_train.runtime import cpu  # noqa: E402

cpu.apply_process_settings()  # oneDNN kernels, BFC allocator: as the commands

# --form: (the layers context the towers enter for it, the form's name).
FORMS = {'dilation': ('dilated_depthwise_in_one_op', 'one op'),
         'filter_gradient': ('filter_gradient_as_matmul', 'patches'),
         'pooling_projection': ('broadcast_input_projected_once', 'once')}
# The forms built whatever the kernels.
ANY_KERNELS = ('pooling_projection',)
WITHOUT = 'without'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--form', choices=sorted(FORMS), required=True)
  parser.add_argument('--rounds', type=int, default=8)
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('flags', nargs='*', help="deeplab-bench's flags")
  args = parser.parse_args()
  # pylint: disable=g-import-not-at-top
  from absl import flags
  import numpy as np
  import tensorflow.compat.v1 as tf
  from deeplab_train.cli import bench as bench_cli
  from deeplab_train.model import layers
  from deeplab_train.runtime import session_config
  from deeplab_train.train import graph as graph_lib

  flags.FLAGS(['onednn_forms_step'] + args.flags)
  job = bench_cli.options_from_flags()
  model, train = job.model_options, job.train_options
  if (args.form not in ANY_KERNELS
      and not session_config.onednn_kernels_on()):
    sys.exit('oneDNN kernels are off (TF_ENABLE_ONEDNN_OPTS=0?): the '
             'towers build none of these forms, nothing to compare')
  rng = np.random.RandomState(0)
  batch, (height, width) = train.train_batch_size, model.crop_size
  images = rng.uniform(0, 255, (batch, height, width, 3)).astype(np.float32)
  labels = rng.randint(0, model.num_classes,
                       (batch, height, width, 1)).astype(np.int32)

  def input_fn():
    return {'image': tf.constant(images), 'label': tf.constant(labels)}

  context_name, form_name = FORMS[args.form]
  context = getattr(layers, context_name)
  sessions = {}
  for name, replacement in ((WITHOUT, lambda enabled=True: context(False)),
                            (form_name, context)):
    setattr(layers, context_name, replacement)
    try:
      built = graph_lib.build_training_graph(model, train, ignore_label=255,
                                             input_fn=input_fn)
    finally:
      setattr(layers, context_name, context)
    sess = tf.Session(graph=built.graph,
                      config=session_config.from_train_options(train))
    with built.graph.as_default():
      sess.run(tf.global_variables_initializer())
    for _ in range(3):  # warm-up
      sess.run(built.train_op)
    sessions[name] = (sess, built.train_op)

  times = {name: [] for name in sessions}
  names = list(sessions)
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      sess, train_op = sessions[name]
      for _ in range(args.steps):
        start = time.perf_counter()
        sess.run(train_op)
        times[name].append(time.perf_counter() - start)
    print('round %d: %s' % (r + 1, ', '.join(
        '%s %.3f' % (name, statistics.median(t[-args.steps:]))
        for name, t in times.items())), flush=True)
  medians = {name: statistics.median(t) for name, t in times.items()}
  print('median s/step: %s; %s / %s = %.3f' % (
      ', '.join('%s %.3f' % item for item in medians.items()),
      WITHOUT, form_name, medians[WITHOUT] / medians[form_name]))


if __name__ == '__main__':
  main()
