r"""deeplab-export: frozen GraphDef and/or SavedModel from a checkpoint.

    deeplab-export --checkpoint_path=TRAIN_LOGDIR/model.ckpt-N \\
        --export_path=OUT/frozen_inference_graph.pb \\
        [--saved_model_dir=OUT/saved_model] [--crop_size=513,513] \\
        [--inference_scales=1.0 ...] [--add_flipped_images]

The frozen graph keeps the original export's interface: input
`ImageTensor:0` (uint8 [1, H, W, 3]), output `SemanticPredictions:0`
(int32 [1, H, W]); images are padded to --crop_size with the mean pixel.
Model options come from the deeplab_config.json beside the checkpoint; for a
checkpoint without one (e.g. the model zoo) the model flags describe the
network, with the original export's defaults (--num_classes=21,
--output_stride=8). Prints one JSON line; exit codes: 0 ok, 2 bad input,
1 unexpected error.
"""
import logging
import os

from absl import flags

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import inference_flags
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.export import freeze
from deeplab_train.export import savedmodel

FLAGS = flags.FLAGS
COMMAND = 'deeplab-export'

# The original export_model.py's default, used when no saved config says
# otherwise.
EXPORT_DEFAULT_OUTPUT_STRIDE = 8

flags.DEFINE_string('checkpoint_path', None,
                    'Checkpoint prefix, or a directory (its latest '
                    'checkpoint).')
flags.DEFINE_string('export_path', None,
                    'Path of the frozen GraphDef (.pb) to write.')
flags.DEFINE_string('saved_model_dir', None,
                    'Also (or only) write a SavedModel to this directory.')
# deeplab-build-data defines the same flag (same type and default); either
# definition may be the one registered when both modules are imported.
flags.DEFINE_integer('num_classes', 21,
                     'Number of classes (only for checkpoints without a '
                     'saved config).', allow_override=True)
flags.DEFINE_multi_string('crop_size', ['513', '513'],
                          'Crop size HEIGHT,WIDTH that input images are '
                          'padded to (--crop_size=513,513 or, as the '
                          'original, --crop_size=513 --crop_size=513).')
flags.DEFINE_multi_float('inference_scales', [1.0],
                         'The scales to resize images for inference.')
flags.DEFINE_bool('save_inference_graph', False,
                  'Also save the unfrozen inference graph as text '
                  '(inference_graph.pbtxt beside --export_path).')
flags.DEFINE_bool('export_probabilities', True,
                  'Also export SemanticProbabilities:0 (and the SavedModel\'s '
                  '"probabilities" output).')


def _num_classes(saved_model):
  if saved_model is not None and not common_flags.explicitly_set(
      'num_classes'):
    return saved_model.num_classes
  return FLAGS.num_classes


def build_options():
  """Flags (+ saved run config) -> (checkpoint, ModelOptions, ExportOptions).

  Raises:
    config.ConfigError: missing or contradicting flags, no checkpoint.
  """
  if not FLAGS.checkpoint_path:
    raise config.ConfigError('--checkpoint_path is required')
  if not (FLAGS.export_path or FLAGS.saved_model_dir):
    raise config.ConfigError('--export_path (frozen .pb) and/or '
                             '--saved_model_dir is required')
  checkpoint = predictor_lib.resolve_checkpoint(FLAGS.checkpoint_path)
  saved_model, saved_pre, _ = inference_flags.saved_run_config(
      os.path.dirname(checkpoint))
  if saved_model is None and not common_flags.explicitly_set('output_stride'):
    FLAGS.output_stride = EXPORT_DEFAULT_OUTPUT_STRIDE
  model_options = common_flags.model_options(_num_classes(saved_model), None,
                                             saved=saved_model)
  export_options = config.ExportOptions(
      inference=config.InferenceOptions(
          crop_size=inference_flags.parse_crop(FLAGS.crop_size, 'crop_size'),
          scales=FLAGS.inference_scales,
          add_flipped_images=FLAGS.add_flipped_images,
          image_pyramid=FLAGS.image_pyramid),
      with_probabilities=FLAGS.export_probabilities,
      **common_flags.resize_values(saved_pre)).validate()
  return checkpoint, model_options, export_options


def run_export(checkpoint, model_options, export_options):
  """Writes the requested exports; returns what was written (a dict)."""
  frozen, graph_def, _ = freeze.freeze(checkpoint, model_options,
                                       export_options)
  out = {'checkpoint': checkpoint, 'export_path': None,
         'saved_model_dir': None}
  if FLAGS.export_path:
    freeze.write_frozen_graph(frozen, FLAGS.export_path)
    out['export_path'] = FLAGS.export_path
    if FLAGS.save_inference_graph:
      out['inference_graph'] = freeze.write_inference_graph(
          graph_def, FLAGS.export_path)
  if FLAGS.saved_model_dir:
    savedmodel.write_saved_model(frozen, FLAGS.saved_model_dir)
    out['saved_model_dir'] = FLAGS.saved_model_dir
  return out


def _export():
  out = run_export(*build_options())
  app.print_result('ok', **out)


def main(argv):
  logging.getLogger().setLevel(logging.INFO)
  return app.run_body(COMMAND, argv, _export)


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
