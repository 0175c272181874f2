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
import dataclasses
import os
from typing import Optional

from absl import flags

from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import inference_flags
from deeplab_train.cli import output_paths
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.export import freeze
from deeplab_train.export import savedmodel

FLAGS = flags.FLAGS
COMMAND = 'deeplab-export'
# Option fields whose flag is not named after the field.
FLAG_NAMES = {'InferenceOptions.scales': 'inference_scales',
              'ExportOptions.with_probabilities': 'export_probabilities'}

# The original export_model.py's defaults, used when no saved config says
# otherwise.
EXPORT_MODEL_DEFAULTS = {'output_stride': 8}

# deeplab-export's own flags: the checkpoint, the outputs and the graph's
# input crop and scales.
_EXPORT_TABLE = (
    ('string', 'checkpoint_path', None,
     'Checkpoint prefix, or a directory (its latest checkpoint).'),
    ('string', 'export_path', None,
     'Path of the frozen GraphDef (.pb) to write.'),
    ('string', 'saved_model_dir', None,
     'Also (or only) write a SavedModel to this directory.'),
    # deeplab-build-data defines the same flag (same type and default); either
    # definition may be the one registered when both modules are imported.
    ('integer', 'num_classes', 21,
     'Number of classes (only for checkpoints without a saved config).',
     {'allow_override': True}),
    ('multi_string', 'crop_size', ['513', '513'],
     'Crop size HEIGHT,WIDTH that input images are padded to '
     '(--crop_size=513,513 or, as the original, --crop_size=513 '
     '--crop_size=513).'),
    ('multi_float', 'inference_scales', [1.0],
     'The scales to resize images for inference.'),
    ('boolean', 'save_inference_graph', False,
     'Also save the unfrozen inference graph as text (inference_graph.pbtxt '
     'beside --export_path).'),
    ('boolean', 'export_probabilities', True,
     'Also export SemanticProbabilities:0 (and the SavedModel\'s '
     '"probabilities" output).'),
)
flag_table.define(_EXPORT_TABLE)


@dataclasses.dataclass(frozen=True)
class ExportJob:
  """Which checkpoint to export, as what, and where."""
  checkpoint: str
  model_options: config.ModelOptions
  export_options: config.ExportOptions
  export_path: Optional[str] = None
  saved_model_dir: Optional[str] = None
  save_inference_graph: bool = False


def _num_classes(saved_model):
  if saved_model is not None and not common_flags.explicitly_set(
      'num_classes'):
    return saved_model.num_classes
  return FLAGS.num_classes


def options_from_flags():
  """Flags (+ saved run config) -> an ExportJob.

  Raises:
    config.ConfigError: missing or contradicting flags, no checkpoint.
  """
  common_flags.require(FLAGS.checkpoint_path, 'checkpoint_path')
  if not (FLAGS.export_path or FLAGS.saved_model_dir):
    raise config.ConfigError('--export_path (frozen .pb) and/or '
                             '--saved_model_dir is required')
  output_paths.check_output_file('export_path', FLAGS.export_path)
  output_paths.check_output_folder('saved_model_dir', FLAGS.saved_model_dir)
  checkpoint = predictor_lib.resolve_checkpoint(FLAGS.checkpoint_path)
  saved_model, saved_pre, _ = inference_flags.saved_run_config(
      os.path.dirname(checkpoint))
  model_options = common_flags.model_options(
      _num_classes(saved_model), None, saved=saved_model,
      defaults=EXPORT_MODEL_DEFAULTS if saved_model is None else None)
  export_options = config.ExportOptions(
      inference=inference_flags.inference_options('crop_size',
                                                  'inference_scales'),
      with_probabilities=FLAGS.export_probabilities,
      **common_flags.resize_values(saved_pre)).validate()
  return ExportJob(checkpoint=checkpoint, model_options=model_options,
                   export_options=export_options,
                   export_path=FLAGS.export_path,
                   saved_model_dir=FLAGS.saved_model_dir,
                   save_inference_graph=FLAGS.save_inference_graph)


def run_export(job):
  """Writes the requested exports; returns what was written (a dict)."""
  frozen, graph_def, _ = freeze.freeze(job.checkpoint, job.model_options,
                                       job.export_options)
  out = {'checkpoint': job.checkpoint, 'export_path': None,
         'saved_model_dir': None}
  if job.export_path:
    freeze.write_frozen_graph(frozen, job.export_path)
    out['export_path'] = job.export_path
    if job.save_inference_graph:
      out['inference_graph'] = freeze.write_inference_graph(
          graph_def, job.export_path)
  if job.saved_model_dir:
    savedmodel.write_saved_model(frozen, job.saved_model_dir)
    out['saved_model_dir'] = job.saved_model_dir
  return out


def _export():
  app.print_result('ok', **run_export(options_from_flags()))


main = inference_flags.main_for(COMMAND, _export, FLAG_NAMES)


def run():
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
