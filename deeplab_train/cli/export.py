r"""deeplab-export: frozen GraphDef, SavedModel and/or TFLite model from a
checkpoint.

    deeplab-export --checkpoint_path=TRAIN_LOGDIR/model.ckpt-N \
        --export_path=OUT/frozen_inference_graph.pb \
        [--saved_model_dir=OUT/saved_model] [--crop_size=513,513] \
        [--inference_scales=1.0 ...] [--add_flipped_images] \
        [--tflite_path=OUT/model.tflite \
         [--tflite_quantize=none|float16|dynamic|int8 --dataset_dir=...]]

The frozen graph keeps the original export's interface: input
`ImageTensor:0` (uint8 [1, H, W, 3]), output `SemanticPredictions:0`
(int32 [1, H, W]); images are padded to --crop_size with the mean pixel.
The SavedModel's 'serving_default' signature takes a batch of images of one
size (uint8 [N, H, W, 3]), its 'single_image' signature one image as
ImageTensor:0 does (deeplab_train/export/savedmodel.py).
--tflite_path writes a TFLite model of the same network (TensorFlow's
converter) at the fixed --crop_size: uint8 [1, crop_h, crop_w, 3] in, int32
class ids [1, crop_h, crop_w] out (and probabilities with
--export_probabilities); it does not resize or pad, the caller gives
images of the crop size padded with the mean pixel
(deeplab_train/export/tflite.py). --tflite_quantize=int8 calibrates on
--num_calibration_images images of --calibration_split read from
--dataset_dir. Any of --export_path, --saved_model_dir, --tflite_path may
be given alone.
Model options come from the deeplab_config.json beside the checkpoint; for a
checkpoint without one (e.g. the model zoo) the model flags describe the
network, with the original export's defaults (--num_classes=21,
--output_stride=8). Prints one JSON line; exit codes: 0 ok, 2 bad input,
143 / 130 stopped by SIGTERM / SIGINT (its outputs left as they were), 1
unexpected error.
"""
import dataclasses
import logging
import os
import typing
from typing import Optional

from absl import flags

from deeplab_train import atomic
from deeplab_train import config
from deeplab_train.cli import app
from deeplab_train.cli import common_flags
from deeplab_train.cli import flag_table
from deeplab_train.cli import inference_flags
from deeplab_train.cli import output_paths
from deeplab_train.data import datasets
# Library modules that load TensorFlow (seconds) are imported by the
# functions using them, after the flag checks: --help, a bad flag and a
# missing one are answered without it (tests/test_command_start.py).

if typing.TYPE_CHECKING:
  # For ExportJob's annotation only: the functions import it when they run,
  # as it loads TensorFlow.
  from deeplab_train.export import tflite

FLAGS = flags.FLAGS
COMMAND = 'deeplab-export'
# Option fields whose flag is not named after the field.
FLAG_NAMES = {'InferenceOptions.scales': 'inference_scales',
              'ExportOptions.with_probabilities': 'export_probabilities',
              'TfliteOptions.quantize': 'tflite_quantize',
              'resolve_checkpoint.checkpoint_dir': 'checkpoint_path'}

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
    ('string', 'tflite_path', None,
     'Also (or only) write a TFLite model (.tflite) of the network at the '
     'fixed --crop_size.'),
    ('enum', 'tflite_quantize', 'none',
     'TFLite quantization: none (float32), float16 (float16 weights), '
     'dynamic (int8 weights) or int8 (int8 weights and activations, '
     'calibrated on images of --dataset_dir).',
     {'enum_values': list(config.TFLITE_QUANTIZE_MODES)}),
    ('string', 'calibration_split', 'train',
     '--tflite_quantize=int8: the split whose images calibrate the '
     'quantization.'),
    ('integer', 'num_calibration_images', 100,
     '--tflite_quantize=int8: how many images of --calibration_split to '
     'calibrate on.'),
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
  tflite_path: Optional[str] = None
  tflite_options: Optional['tflite.TfliteOptions'] = None
  # int8 calibration data: the TFRecords folder, its DatasetInfo and the
  # eval preprocessing.
  dataset_dir: Optional[str] = None
  dataset_info: Optional[datasets.DatasetInfo] = None
  preprocess_options: Optional[config.PreprocessOptions] = None


def _num_classes(saved_model):
  if saved_model is not None and not common_flags.explicitly_set(
      'num_classes'):
    return saved_model.num_classes
  return FLAGS.num_classes


def _check_outputs_apart():
  """Raises ConfigError when one output would replace another, or the
  --saved_model_dir folder (replaced as a whole) holds other files."""
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.export import savedmodel
  files = [(name, os.path.realpath(FLAGS[name].value))
           for name in ('export_path', 'tflite_path') if FLAGS[name].value]
  if len(files) == 2 and files[0][1] == files[1][1]:
    raise config.ConfigError(
        '--export_path and --tflite_path name the same file, %s: give each '
        'its own path', FLAGS.export_path)
  folder = FLAGS.saved_model_dir
  if not folder:
    return
  where = os.path.realpath(folder)
  inside = [name for name, path in files
            if path == where or path.startswith(where + os.sep)]
  if inside:
    raise config.ConfigError(
        '--%s=%s is --saved_model_dir=%s or inside it, which the export '
        'replaces as a whole: put it elsewhere', inside[0],
        FLAGS[inside[0]].value, folder)
  foreign = savedmodel.foreign_entries(folder)
  if foreign:
    shown = ', '.join(foreign[:5]) + (', ...' if len(foreign) > 5 else '')
    raise config.ConfigError(
        '--saved_model_dir=%s holds %d file(s) that are not a SavedModel\'s '
        '(%s): the export replaces the folder as a whole, so give a new or '
        'empty folder, or that of an earlier SavedModel', folder,
        len(foreign), shown)


def options_from_flags():
  """Flags (+ saved run config) -> an ExportJob.

  Raises:
    config.ConfigError: missing or contradicting flags, no checkpoint.
  """
  inference_flags.refuse_flags_of_the_others(COMMAND, {
      'checkpoint_dir': 'give --checkpoint_path (a checkpoint prefix, or '
                        'the train_logdir for its latest)',
      'eval_scales': 'give --inference_scales, as the original export does',
      'exported_model': 'it exports a checkpoint, given by --checkpoint_path',
      'eval_interval_secs': 'it exports one checkpoint, once; drop it'})
  common_flags.require(FLAGS.checkpoint_path, 'checkpoint_path')
  if not (FLAGS.export_path or FLAGS.saved_model_dir or FLAGS.tflite_path):
    raise config.ConfigError('--export_path (frozen .pb), --saved_model_dir '
                             'and/or --tflite_path is required')
  if FLAGS.save_inference_graph and not FLAGS.export_path:
    # It goes beside the frozen graph: without one it was not written.
    raise config.ConfigError('--save_inference_graph writes '
                             'inference_graph.pbtxt beside the frozen graph: '
                             'add --export_path')
  output_paths.check_output_file('export_path', FLAGS.export_path)
  output_paths.check_output_folder('saved_model_dir', FLAGS.saved_model_dir)
  output_paths.check_output_file('tflite_path', FLAGS.tflite_path)
  _check_outputs_apart()
  tflite_options = _tflite_options()
  # pylint: disable-next=g-import-not-at-top
  from deeplab_train.evaluation import predictor as predictor_lib
  checkpoint = predictor_lib.resolve_checkpoint(FLAGS.checkpoint_path)
  saved_model, saved_pre, saved_dataset = inference_flags.saved_run_config(
      os.path.dirname(checkpoint))
  model_options = common_flags.model_options(
      _num_classes(saved_model), None, saved=saved_model,
      defaults=EXPORT_MODEL_DEFAULTS if saved_model is None else None,
      inference=True)
  # Read once: the calibration's resizing is the exported graph's.
  resize = common_flags.resize_values(saved_pre, inference=True)
  export_options = config.ExportOptions(
      inference=inference_flags.inference_options('crop_size',
                                                  'inference_scales'),
      with_probabilities=FLAGS.export_probabilities, **resize).validate()
  return ExportJob(checkpoint=checkpoint, model_options=model_options,
                   export_options=export_options,
                   export_path=FLAGS.export_path,
                   saved_model_dir=FLAGS.saved_model_dir,
                   save_inference_graph=FLAGS.save_inference_graph,
                   tflite_path=FLAGS.tflite_path,
                   tflite_options=tflite_options,
                   **_calibration_data(tflite_options, saved_dataset,
                                       saved_pre, resize))


def _tflite_options():
  """TfliteOptions from the flags, or None without --tflite_path."""
  tflite_flags = ('tflite_quantize', 'calibration_split',
                  'num_calibration_images')
  if not FLAGS.tflite_path:
    given = [f for f in tflite_flags if common_flags.explicitly_set(f)]
    if given:
      raise config.ConfigError('--%s only applies to the TFLite model: add '
                               '--tflite_path' % given[0])
    return None
  if FLAGS.tflite_quantize != 'int8':
    for name in tflite_flags[1:]:
      if common_flags.explicitly_set(name):
        logging.warning('--%s is ignored: only --tflite_quantize=int8 '
                        'calibrates', name)
  from deeplab_train.export import tflite  # pylint: disable=g-import-not-at-top
  return tflite.TfliteOptions(
      quantize=FLAGS.tflite_quantize,
      calibration_split=FLAGS.calibration_split,
      num_calibration_images=FLAGS.num_calibration_images).validate()


def _calibration_data(tflite_options, saved_dataset, saved_pre, resize):
  """ExportJob's calibration fields (int8 only), checked now: a missing
  --dataset_dir or empty split fails before any conversion. `resize`: the
  export's resize values (common_flags.resize_values of `saved_pre`)."""
  if tflite_options is None or tflite_options.quantize != 'int8':
    return {}
  from deeplab_train.export import tflite  # pylint: disable=g-import-not-at-top
  tflite.check_calibration_split(FLAGS.dataset_dir,
                                 tflite_options.calibration_split)
  return {'dataset_dir': FLAGS.dataset_dir,
          'dataset_info': common_flags.dataset_info(saved_dataset),
          'preprocess_options': inference_flags.preprocess_options(
              saved_pre, resize)}


def run_export(job):
  """Writes the requested exports; returns what was written (a dict)."""
  # pylint: disable=g-import-not-at-top
  from deeplab_train.export import freeze
  from deeplab_train.export import savedmodel
  from deeplab_train.export import tflite
  out = {'checkpoint': job.checkpoint, 'export_path': None,
         'saved_model_dir': None, 'tflite_path': None}
  # Converted first: a network TFLite refuses fails before anything is
  # written.
  tflite_model = _tflite_model(job, out) if job.tflite_path else None
  # All put in place at the end: a failure (a full disk at the SavedModel)
  # leaves every output as it was, not a new .pb beside an old SavedModel.
  with atomic.together():
    if job.export_path:
      frozen, graph_def, _ = freeze.freeze(job.checkpoint, job.model_options,
                                           job.export_options)
      freeze.write_frozen_graph(frozen, job.export_path)
      out['export_path'] = job.export_path
      if job.save_inference_graph:
        out['inference_graph'] = freeze.write_inference_graph(
            graph_def, job.export_path)
    if job.saved_model_dir:
      savedmodel.write_saved_model(job.checkpoint, job.model_options,
                                   job.export_options, job.saved_model_dir)
      out['saved_model_dir'] = job.saved_model_dir
    if tflite_model is not None:
      out['tflite_path'] = tflite.write_tflite(tflite_model, job.tflite_path)
      out['tflite_bytes'] = len(tflite_model)
  return out


def _tflite_model(job, out):
  """The .tflite bytes of the job's network; notes the quantization (and
  the calibration images used) in `out`."""
  # pylint: disable=g-import-not-at-top
  from deeplab_train.export import tflite
  from deeplab_train.model import registry
  calibration = None
  if job.tflite_options.quantize == 'int8':
    calibration = tflite.calibration_images(
        job.dataset_dir, job.tflite_options.calibration_split,
        job.dataset_info, job.preprocess_options,
        registry.mean_pixel(job.model_options.model_variant),
        job.export_options.inference.crop_size,
        job.tflite_options.num_calibration_images)
  model, used = tflite.convert(job.checkpoint, job.model_options,
                               job.export_options, job.tflite_options,
                               calibration=calibration)
  out['tflite_quantize'] = job.tflite_options.quantize
  if used is not None:
    out['calibration_images'] = used
  return model


def _export():
  app.print_final_result('ok', **run_export(options_from_flags()))


main = inference_flags.main_for(COMMAND, _export, FLAG_NAMES,
                                checkpoint_flag='checkpoint_path')


def run():
  # The command's own defaults, so that --help shows them too (set here, in
  # the command's process only: the flags are shared with the other
  # commands, which keep theirs).
  for name, value in EXPORT_MODEL_DEFAULTS.items():
    FLAGS.set_default(name, value)
  inference_flags.run_app(COMMAND, main, __doc__, __name__)


if __name__ == '__main__':
  run()
