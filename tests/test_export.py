"""deeplab-export: the frozen graph's contract, SavedModel, the reference."""
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
from PIL import Image
import pytest
import tensorflow.compat.v1 as tf

import eval_testing as et
import reference_checkpoint
import train_testing as tt
from deeplab_train import config
from deeplab_train import restore as restore_lib
from deeplab_train.cli import export as export_cli
from deeplab_train.evaluation import predictor as predictor_lib
from deeplab_train.export import freeze
from deeplab_train.export import savedmodel


@pytest.fixture(scope='module')
def tiny_ckpt(tmp_path_factory):
  logdir = str(tmp_path_factory.mktemp('tiny_export') / 'train')
  return et.write_checkpoint(logdir, et.tiny_model_options())


@pytest.fixture(scope='module')
def in_graph_41(tiny_ckpt):
  """In-graph labels of the tiny images, padded to 41x41 as the export is."""
  return _in_graph_labels(et.tiny_model_options(),
                          config.InferenceOptions(crop_size=(41, 41)),
                          tiny_ckpt,
                          [image for _, image, _ in et.tiny_images()])


def _in_graph_labels(model_options, inference, checkpoint, images):
  with predictor_lib.Predictor(model_options, inference) as predictor:
    predictor.restore(checkpoint)
    return predictor.predict([im.astype(np.float32) for im in images])


def _eager_saved_model_labels(saved_model_dir, images, tmp_path,
                              batch=None):
  """Loads the SavedModel with TF2's tf.saved_model.load in a fresh process.

  A fresh process, because other tests may have switched this one to graph
  mode (tf.disable_v2_behavior); the SavedModel must run eagerly. Each image
  goes through both signatures (batch of one, and 'single_image'); `batch`
  (uint8 [N, H, W, 3]) through the batch signature in one call.
  """
  np.savez(tmp_path / 'in.npz', *images)
  np.save(tmp_path / 'batch.npy', np.zeros((0, 1, 1, 3), np.uint8)
          if batch is None else batch)
  script = textwrap.dedent('''
      import sys, numpy as np, tensorflow as tf
      assert tf.executing_eagerly()
      model = tf.saved_model.load(sys.argv[1])
      serve = model.signatures['serving_default']
      single = model.signatures['single_image']
      inputs = np.load(sys.argv[2])
      out = {}
      for i in range(len(inputs.files)):
        image = tf.constant(inputs['arr_%d' % i][None])
        result = serve(images=image)
        out['labels_%d' % i] = result['labels'].numpy()
        out['probs_%d' % i] = result['probabilities'].numpy()
        result = single(image=image)
        out['single_labels_%d' % i] = result['labels'].numpy()
        out['single_probs_%d' % i] = result['probabilities'].numpy()
      batch = np.load(sys.argv[4])
      if len(batch):
        result = serve(images=tf.constant(batch))
        out['batch_labels'] = result['labels'].numpy()
        out['batch_probs'] = result['probabilities'].numpy()
      np.savez(sys.argv[3], **out)
  ''')
  subprocess.run([sys.executable, '-c', script, saved_model_dir,
                  str(tmp_path / 'in.npz'), str(tmp_path / 'out.npz'),
                  str(tmp_path / 'batch.npy')],
                 check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  return np.load(tmp_path / 'out.npz')


def test_frozen_graph_and_saved_model_match_in_graph_inference(
    tiny_ckpt, in_graph_41, tmp_path, capsys):
  out = tmp_path / 'out'
  code = et.run_cli(export_cli, [
      '--checkpoint_path=' + tiny_ckpt, '--export_path=%s/frozen.pb' % out,
      '--saved_model_dir=%s/saved_model' % out, '--crop_size=41,41',
      '--save_inference_graph'])
  assert code == 0
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert line['status'] == 'ok' and line['checkpoint'] == tiny_ckpt
  # Only the finished outputs: no temp files left behind.
  assert sorted(os.listdir(out)) == ['frozen.pb', 'inference_graph.pbtxt',
                                     'saved_model']

  graph_def = freeze.load_frozen_graph(str(out / 'frozen.pb'))
  ops = {n.op for n in graph_def.node}
  assert not ops & {'VariableV2', 'VarHandleOp', 'ReadVariableOp'}
  placeholders = [n for n in graph_def.node if n.op == 'Placeholder']
  assert [n.name for n in placeholders] == ['ImageTensor']
  assert placeholders[0].attr['dtype'].type == tf.uint8.as_datatype_enum

  images = [image for _, image, _ in et.tiny_images()]
  want = in_graph_41
  # Three images of one size for the batch signature.
  batch = np.stack([image for _, image, _ in
                    et.tiny_images(seed=1, sizes=((37, 29),) * 3)])
  served = _eager_saved_model_labels(str(out / 'saved_model'), images,
                                     tmp_path, batch=batch)
  for i, image in enumerate(images):
    frozen = freeze.run_frozen_graph(graph_def, image)
    assert frozen.shape == (1,) + image.shape[:2]
    assert frozen.dtype == np.int32
    np.testing.assert_array_equal(frozen[0], want[i])
    for signature in ('', 'single_'):
      np.testing.assert_array_equal(served[signature + 'labels_%d' % i][0],
                                    want[i])
      probs = served[signature + 'probs_%d' % i]
      assert probs.shape == (1,) + image.shape[:2] + (et.NUM_CLASSES,)
      np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-4)
  assert len(np.unique(np.concatenate([w.ravel() for w in want]))) >= 2
  # The batch of 3 in one call: each image's labels are the .pb's.
  assert served['batch_labels'].shape == (3, 37, 29)
  assert served['batch_labels'].dtype == np.int32
  assert served['batch_probs'].shape == (3, 37, 29, et.NUM_CLASSES)
  for image, labels, probs in zip(batch, served['batch_labels'],
                                  served['batch_probs']):
    np.testing.assert_array_equal(labels,
                                  freeze.run_frozen_graph(graph_def, image)[0])
    np.testing.assert_allclose(
        probs, freeze.run_frozen_graph(graph_def, image,
                                       freeze.PROB_NAME)[0], atol=1e-5)


def test_saved_model_on_a_full_disk_keeps_the_old_and_no_temp(
    tiny_ckpt, tmp_path, monkeypatch, capsys):
  """TensorFlow's SavedModel writer fails as on a full disk: the command
  says which folder in one line (exit 1), the SavedModel already there is
  unchanged and the temp folder is gone. So is the frozen graph asked for
  in the same command: before, it was the new one beside the old
  SavedModel."""
  old = tmp_path / 'saved_model'
  old.mkdir()
  (old / 'saved_model.pb').write_bytes(b'the previous export')
  frozen = tmp_path / 'frozen.pb'
  frozen.write_bytes(b'the previous frozen graph')

  def full_disk(self, *args, **kwargs):
    raise tf.errors.ResourceExhaustedError(
        None, None, '%s; No space left on device' % old)
  monkeypatch.setattr(tf.saved_model.Builder, 'save', full_disk)
  code = et.run_cli(export_cli, ['--checkpoint_path=' + tiny_ckpt,
                                 '--saved_model_dir=%s' % old,
                                 '--export_path=%s' % frozen,
                                 '--crop_size=41,41'])
  err = capsys.readouterr().err
  assert code == 1
  assert 'Traceback' not in err
  assert ('deeplab-export: error: cannot write %s: %s; No space left on '
          'device' % (old, old)) in err.splitlines()
  assert sorted(os.listdir(tmp_path)) == ['frozen.pb', 'saved_model']
  assert frozen.read_bytes() == b'the previous frozen graph'
  assert os.listdir(old) == ['saved_model.pb']
  assert (old / 'saved_model.pb').read_bytes() == b'the previous export'


def test_outputs_that_would_replace_one_another_or_other_files_are_refused(
    tiny_ckpt, tmp_path, capsys):
  """--saved_model_dir replaces its folder as a whole: a folder of other
  files lost them all (and the .pb written into it), with exit 0. The same
  path for --export_path and --tflite_path was overwritten, with exit 1
  and 'No such file or directory'. Each is refused before any work now."""
  kept = tmp_path / 'photos'
  kept.mkdir()
  (kept / 'notes.txt').write_text('important')
  (kept / 'a.jpg').write_bytes(b'jpeg')
  same = tmp_path / 'm.bin'
  same.write_bytes(b'OLD')

  def refused(*outputs):
    code = et.run_cli(export_cli, ['--checkpoint_path=' + tiny_ckpt,
                                   '--crop_size=41,41'] + list(outputs))
    assert code == 2
    return capsys.readouterr().err.splitlines()[-1]
  assert refused('--saved_model_dir=%s' % kept) == (
      'deeplab-export: error: --saved_model_dir=%s holds 2 file(s) that are '
      "not a SavedModel's (a.jpg, notes.txt): the export replaces the folder "
      'as a whole, so give a new or empty folder, or that of an earlier '
      'SavedModel' % kept)
  assert refused('--saved_model_dir=%s' % kept,
                 '--export_path=%s/frozen.pb' % kept) == (
      'deeplab-export: error: --export_path=%s/frozen.pb is '
      '--saved_model_dir=%s or inside it, which the export replaces as a '
      'whole: put it elsewhere' % (kept, kept))
  # The same path for both ran the whole export, then failed (exit 1).
  fresh = tmp_path / 'fresh'
  assert refused('--saved_model_dir=%s' % fresh,
                 '--tflite_path=%s' % fresh).startswith(
                     'deeplab-export: error: --tflite_path=%s is '
                     '--saved_model_dir=%s or inside it' % (fresh, fresh))
  # A file path ending in a slash failed after the work, exit 1.
  assert refused('--export_path=%s/new/' % tmp_path) == (
      'deeplab-export: error: --export_path=%s/new/ ends with a slash, as a '
      'folder does: give the path of a file you can write (e.g. '
      '%s/new/model)' % (tmp_path, tmp_path))
  # Written beside the frozen graph only: without one it was ignored.
  assert refused('--saved_model_dir=%s' % fresh,
                 '--save_inference_graph') == (
      'deeplab-export: error: --save_inference_graph writes '
      'inference_graph.pbtxt beside the frozen graph: add --export_path')
  assert not fresh.exists()
  assert refused('--export_path=%s' % same, '--tflite_path=%s' % same) == (
      'deeplab-export: error: --export_path and --tflite_path name the same '
      'file, %s: give each its own path' % same)
  assert sorted(os.listdir(kept)) == ['a.jpg', 'notes.txt']
  assert same.read_bytes() == b'OLD'


def test_multi_scale_flipped_export_matches_in_graph(tiny_ckpt, tmp_path):
  pb = str(tmp_path / 'ms.pb')
  assert et.run_cli(export_cli, [
      '--checkpoint_path=' + os.path.dirname(tiny_ckpt), '--export_path=' + pb,
      '--crop_size=41', '--crop_size=41', '--inference_scales=0.5',
      '--inference_scales=1.0', '--add_flipped_images']) == 0
  images = [image for _, image, _ in et.tiny_images()[:2]]
  want = _in_graph_labels(
      et.tiny_model_options(),
      config.InferenceOptions(crop_size=(41, 41), scales=(0.5, 1.0),
                              add_flipped_images=True), tiny_ckpt, images)
  graph_def = freeze.load_frozen_graph(pb)
  for image, labels in zip(images, want):
    np.testing.assert_array_equal(freeze.run_frozen_graph(graph_def, image)[0],
                                  labels)


def test_image_larger_than_crop_fails_with_a_message(tiny_ckpt):
  frozen, _, _ = freeze.freeze(
      tiny_ckpt, et.tiny_model_options(),
      config.ExportOptions(
          inference=config.InferenceOptions(crop_size=(41, 41)),
          with_probabilities=False))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='larger than the export crop size 41,41'):
    freeze.run_frozen_graph(frozen, np.zeros((50, 30, 3), np.uint8))


@pytest.mark.slow
def test_saved_model_signatures_resize_like_the_frozen_graph(tiny_ckpt):
  """With max_resize_value both signatures resize and pad as the .pb does,
  image by image, and the weights are stored once for both."""
  options = config.ExportOptions(
      inference=config.InferenceOptions(crop_size=(33, 33)),
      max_resize_value=33, with_probabilities=False)
  frozen, _, _ = freeze.freeze(tiny_ckpt, et.tiny_model_options(), options)
  serving, signatures = savedmodel.freeze_serving_graph(
      tiny_ckpt, et.tiny_model_options(), options)
  assert sorted(signatures) == ['serving_default', 'single_image']
  # One copy of the weights for both signatures.
  constants = lambda graph_def: sum(n.ByteSize() for n in graph_def.node
                                    if n.op == 'Const')
  assert constants(serving) < 1.1 * constants(frozen)
  batch = np.stack([image for _, image, _ in
                    et.tiny_images(seed=2, sizes=((57, 49),) * 3)])
  with tf.Graph().as_default() as graph:
    tf.import_graph_def(serving, name='')
    with tf.Session(graph=graph) as sess:
      inputs, outputs = signatures['serving_default']
      batch_labels = sess.run(outputs['labels'], {inputs['images']: batch})
      inputs, outputs = signatures['single_image']
      single = [sess.run(outputs['labels'], {inputs['image']: image[None]})
                for image in batch]
  assert batch_labels.shape == (3, 57, 49)
  for image, labels, one in zip(batch, batch_labels, single):
    want = freeze.run_frozen_graph(frozen, image)
    np.testing.assert_array_equal(labels, want[0])
    np.testing.assert_array_equal(one, want)


def test_resize_range_is_undone_at_the_output(tiny_ckpt):
  """With max_resize_value the net sees a smaller image; output: input size."""
  frozen, _, _ = freeze.freeze(
      tiny_ckpt, et.tiny_model_options(),
      config.ExportOptions(
          inference=config.InferenceOptions(crop_size=(33, 33)),
          max_resize_value=33, with_probabilities=False))
  labels = freeze.run_frozen_graph(frozen, np.full((57, 49, 3), 90, np.uint8))
  assert labels.shape == (1, 57, 49)


def test_model_zoo_checkpoint_takes_model_flags(tiny_ckpt, in_graph_41,
                                                tmp_path, capsys):
  """No deeplab_config.json: the model flags describe the network."""
  bare = tmp_path / 'zoo'
  bare.mkdir()
  prefix = str(bare / 'model.ckpt')
  reader = tf.train.load_checkpoint(tiny_ckpt)
  with tf.Graph().as_default():
    variables = [tf.Variable(reader.get_tensor(name), name=name)
                 for name in reader.get_variable_to_shape_map()]
    with tf.Session() as sess:
      sess.run(tf.variables_initializer(variables))
      tf.train.Saver(variables).save(sess, prefix)
  model_flags = ['--model_variant=mobilenet_v2', '--depth_multiplier=0.25',
                 '--aspp_convs_filters=16', '--num_classes=3']
  pb = str(tmp_path / 'zoo.pb')
  args = ['--checkpoint_path=' + prefix, '--export_path=' + pb,
          '--crop_size=41,41']
  # Without the flags the default network (depth 1.0) does not match.
  assert et.run_cli(export_cli, args) == 2
  err = capsys.readouterr().err
  assert 'does not match the network' in err
  assert ('Without a deeplab_config.json beside the checkpoint, pass the '
          'model flags it was trained with (--model_variant, ') in err
  # The original export's default output stride (8) is the one trained here.
  assert et.run_cli(export_cli, args + model_flags) == 0
  image = et.tiny_images()[0][1]
  got = freeze.run_frozen_graph(freeze.load_frozen_graph(pb), image)[0]
  np.testing.assert_array_equal(got, in_graph_41[0])


def test_contradicting_flag_and_missing_checkpoint(tiny_ckpt, tmp_path,
                                                   capsys):
  pb = str(tmp_path / 'x.pb')
  assert et.run_cli(export_cli, ['--checkpoint_path=' + tiny_ckpt,
                                 '--export_path=' + pb,
                                 '--depth_multiplier=1.0']) == 2
  assert '--depth_multiplier=1.0 (trained with 0.25)' in (
      capsys.readouterr().err)
  assert et.run_cli(export_cli, ['--checkpoint_path=%s/none' % tmp_path,
                                 '--export_path=' + pb]) == 2
  assert not os.path.exists(pb)


def _damaged_copy(prefix, folder):
  """A copy of checkpoint `prefix` whose data file is cut in half."""
  import shutil  # pylint: disable=g-import-not-at-top
  src = os.path.dirname(prefix)
  shutil.copytree(src, folder)
  copy = os.path.join(folder, os.path.basename(prefix))
  data = copy + '.data-00000-of-00001'
  with open(data, 'rb') as f:
    content = f.read()
  with open(data, 'wb') as f:
    f.write(content[:len(content) // 2])
  return copy


def test_damaged_checkpoint_is_named_not_a_traceback(tiny_ckpt, tmp_path,
                                                     capsys):
  damaged = _damaged_copy(tiny_ckpt, str(tmp_path / 'train'))
  pb = str(tmp_path / 'x.pb')
  assert et.run_cli(export_cli, ['--checkpoint_path=' + damaged,
                                 '--export_path=' + pb]) == 2
  err = capsys.readouterr().err
  assert ('checkpoint %s cannot be read: its data is damaged or cut short'
          % damaged) in err
  # TensorFlow's reason, not the node it ran ('([[{{node save/RestoreV2}}]])').
  reason = err.split('damaged or cut short (', 1)[1].split(');', 1)[0]
  assert reason and not reason.startswith('[['), err
  assert 'Traceback' not in err and not os.path.exists(pb)
  # Eval and vis restore through the same Predictor.
  with predictor_lib.Predictor(et.tiny_model_options(),
                               config.InferenceOptions()) as predictor:
    with pytest.raises(config.ConfigError, match='damaged or cut short'):
      predictor.restore(damaged)


@pytest.mark.parametrize('keep', [0, 300])
def test_damaged_checkpoint_index_is_named_not_a_traceback(
    tiny_ckpt, tmp_path, capsys, keep):
  """An .index cut short (or empty) was TensorFlow's 'not an sstable (bad
  magic number)' with a traceback, exit 1, in export and eval."""
  import shutil  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / 'train')
  shutil.copytree(os.path.dirname(tiny_ckpt), folder)
  damaged = os.path.join(folder, os.path.basename(tiny_ckpt))
  with open(damaged + '.index', 'rb') as f:
    content = f.read()
  with open(damaged + '.index', 'wb') as f:
    f.write(content[:keep])
  pb = str(tmp_path / 'x.pb')
  assert et.run_cli(export_cli, ['--checkpoint_path=' + damaged,
                                 '--export_path=' + pb]) == 2
  err = capsys.readouterr().err
  assert ('checkpoint %s cannot be read: its .index file is damaged or cut '
          'short (' % damaged) in err
  assert 'Traceback' not in err and not os.path.exists(pb)


def test_folder_without_checkpoints_names_the_flag(tmp_path, capsys):
  """Before, the message told an export to set --checkpoint_dir, a flag
  deeplab-export does not have."""
  assert et.run_cli(export_cli, ['--checkpoint_path=%s' % tmp_path,
                                 '--export_path=%s' % (tmp_path / 'x.pb')
                                 ]) == 2
  err = capsys.readouterr().err.splitlines()[-1]
  assert err.startswith('deeplab-export: error: --checkpoint_path=%s holds '
                        'no checkpoint to read' % tmp_path)
  assert err.endswith('point --checkpoint_path at the train_logdir')


def _space_to_batch_block_shapes(pb):
  graph_def = tf.GraphDef()
  graph_def.ParseFromString(pb.read_bytes())
  block_shapes = set()
  for node in graph_def.node:
    if node.op == 'Const' and 'block_shape' in node.name:
      block_shapes.add(tuple(tf.make_ndarray(node.attr['value'].tensor)))
  return block_shapes


def test_output_stride_and_atrous_rates_may_change_for_inference(
    tmp_path, capsys, caplog):
  """The original's recipe trains at output stride 16 with atrous rates 6,
  12, 18, then evaluates and exports at 8 with 12, 24, 36. Those flags
  (and --multi_grid) change no variable: eval, vis and export take them
  over the saved options, saying so. Before, exit 2 ('model flags
  contradict the options saved with the checkpoint'). Flags that change
  the variables are still refused, and so is a number of rates the
  checkpoint has no branches for: before any graph, saying what to give
  (before, the restore failed, saying to write the deeplab_config.json
  that was there)."""
  logdir = tmp_path / 'train'
  et.write_checkpoint(str(logdir), et.tiny_model_options(
      output_stride=16, atrous_rates=(6, 12, 18)))

  def export(name, *flags):
    pb = tmp_path / name
    code = et.run_cli(export_cli, ['--checkpoint_path=%s' % logdir,
                                   '--export_path=%s' % pb] + list(flags))
    return code, pb, capsys.readouterr().err
  code, os16, _ = export('os16.pb')
  assert code == 0
  with caplog.at_level('WARNING'):
    code, os8, _ = export('os8.pb', '--output_stride=8', '--atrous_rates=12',
                          '--atrous_rates=24', '--atrous_rates=36')
  assert code == 0
  assert ('predicting with --output_stride=8 (trained with 16)'
          in caplog.text)
  # The atrous convolutions' rates, as space-to-batch block shapes.
  assert (24, 24) in _space_to_batch_block_shapes(os8)
  assert (24, 24) not in _space_to_batch_block_shapes(os16)

  code, _, err = export('dm.pb', '--depth_multiplier=0.5')
  assert code == 2
  assert ('model flags contradict the options saved with the checkpoint '
          '(deeplab_config.json): --depth_multiplier=0.5 (trained with '
          '0.25)') in err
  # So do the resize flags, which the graph's message for an image larger
  # than its crop suggests: they were refused as contradicting the saved
  # options.
  with caplog.at_level('WARNING'):
    code, resized, _ = export('resize.pb', '--max_resize_value=65',
                              '--crop_size=65,65')
  assert code == 0
  assert ('predicting with --max_resize_value=65 (trained with it unset)'
          in caplog.text)
  graph_def = tf.GraphDef()
  graph_def.ParseFromString(resized.read_bytes())
  with tf.Graph().as_default() as graph:
    tf.import_graph_def(graph_def, name='')
    with tf.Session(graph=graph) as sess:
      labels = sess.run('SemanticPredictions:0', {'ImageTensor:0': np.zeros(
          [1, 100, 130, 3], np.uint8)})
  assert labels.shape == (1, 100, 130)
  code, _, err = export('two.pb', '--atrous_rates=12', '--atrous_rates=24')
  assert code == 2
  assert err.splitlines()[-1] == (
      'deeplab-export: error: --atrous_rates=12,24 gives 2 rate(s), but the '
      'network was trained with 3 (6,12,18), an ASPP branch of variables '
      "each: give 3 rates (the original's recipe: 12, 24, 36 at "
      '--output_stride=8 for 6, 12, 18 at 16), or drop the flag.')
  assert not (tmp_path / 'two.pb').exists()

  # A deeplab_config.json of another network beside the checkpoint.
  trained, preprocess, dataset = config.load_run_config(str(logdir))
  config.save_run_config(str(logdir), trained.replace(aspp_convs_filters=8),
                         preprocess, dataset)
  code, _, err = export('other.pb')
  assert code == 2
  assert 'with another shape, e.g. image_pooling/weights' in err
  assert err.splitlines()[-1].endswith(
      'The model options were read from %s beside it: does that file '
      'belong to another run?' % (logdir / 'deeplab_config.json'))


@pytest.mark.slow
def test_reference_checkpoint_reproduces_reference_predictions(
    reference_dir, tmp_path):
  """The original's export of the same weights, on the same image."""
  prefix = reference_checkpoint.write_checkpoint(
      reference_checkpoint.load_manifest(
          reference_dir / 'manifests' / 'mobilenet_v2_os8.json'),
      tmp_path / 'ref' / 'model.ckpt')
  pb = str(tmp_path / 'frozen_inference_graph.pb')
  code = et.run_cli(export_cli, [
      '--checkpoint_path=' + prefix, '--export_path=' + pb,
      '--model_variant=mobilenet_v2', '--output_stride=8',
      '--crop_size=513', '--crop_size=513', '--inference_scales=1.0'])
  assert code == 0
  with Image.open(reference_dir / 'input.png') as im:
    image = np.asarray(im.convert('RGB'))
  graph_def = freeze.load_frozen_graph(pb)
  labels = freeze.run_frozen_graph(graph_def, image)
  want = np.load(reference_dir / 'mobilenet_v2_os8' / 'predictions.npy')
  assert labels.shape == want.shape == (1, 193, 257)
  assert np.mean(labels == want) >= 0.99
  logits = freeze.run_frozen_graph(graph_def, image,
                                   'logits/semantic/BiasAdd')
  np.testing.assert_allclose(
      logits, np.load(reference_dir / 'mobilenet_v2_os8' / 'logits.npy'),
      atol=1e-4)


def test_a_checkpoint_deleted_while_read_starts_the_export_again(
    tiny_ckpt, tmp_path, monkeypatch, capsys, caplog):
  """A training run keeping only its newest checkpoints deletes the one
  deeplab-export (eval, vis) reads: given the folder, the command starts
  again from its latest checkpoint (3 times in all); given that
  checkpoint, it says so in one line, exit 2. Before, TensorFlow's 'Failed
  to find any matching files' or a 20-line restore error, or a
  ValueError traceback."""
  real_restore = restore_lib.restore
  calls = []

  def deleted_the_first_time(saver, session, prefix):
    calls.append(prefix)
    if len(calls) == 1:
      raise restore_lib.CheckpointGoneError(prefix)
    return real_restore(saver, session, prefix)
  monkeypatch.setattr(restore_lib, 'restore', deleted_the_first_time)
  pb = str(tmp_path / 'x.pb')
  with caplog.at_level('WARNING'):
    assert et.run_cli(export_cli, [
        '--checkpoint_path=' + os.path.dirname(tiny_ckpt),
        '--export_path=' + pb]) == 0
  assert calls == [tiny_ckpt, tiny_ckpt] and os.path.exists(pb)
  assert ('deeplab-export: checkpoint %s was deleted while it was being read'
          % tiny_ckpt) in caplog.text
  assert 'starting again from the latest checkpoint in' in caplog.text
  capsys.readouterr()

  calls.clear()
  assert et.run_cli(export_cli, ['--checkpoint_path=' + tiny_ckpt,
                                 '--export_path=' + pb]) == 2
  err = capsys.readouterr().err
  assert err.splitlines()[-1] == (
      'deeplab-export: error: checkpoint %s was deleted while it was being '
      'read (the training run writing it keeps only its newest '
      'checkpoints); use a newer one' % tiny_ckpt)
  assert len(calls) == 1


def test_a_checkpoint_deleted_after_it_was_chosen_is_still_exported(
    tiny_ckpt, tmp_path, monkeypatch):
  """The training run deletes the checkpoint deeplab-export chose before
  the export reads it (saves every few seconds, --keep_checkpoint_max=1):
  the export reads the files it pinned when it chose the checkpoint (hard
  links beside it), and removes the pin at the end. Before, the files were
  gone by the restore, and the new latest by the next attempt's: exit 2."""
  logdir = tmp_path / 'train'
  shutil.copytree(os.path.dirname(tiny_ckpt), logdir)
  chosen = str(logdir / os.path.basename(tiny_ckpt))
  (logdir / 'checkpoint').write_text(
      'model_checkpoint_path: "%s"\n' % os.path.basename(chosen))
  before = sorted(os.listdir(logdir))
  real_restore = restore_lib.restore
  deleted = []

  def trainer_deletes_it_first(saver, session, prefix):
    for name in os.listdir(logdir):
      if name.startswith(os.path.basename(chosen) + '.'):
        os.remove(logdir / name)
        deleted.append(name)
    return real_restore(saver, session, prefix)
  monkeypatch.setattr(restore_lib, 'restore', trainer_deletes_it_first)
  pb = tmp_path / 'x.pb'
  saved = tmp_path / 'sm'
  assert et.run_cli(export_cli, ['--checkpoint_path=%s' % logdir,
                                 '--export_path=%s' % pb,
                                 '--saved_model_dir=%s' % saved]) == 0
  assert deleted and pb.stat().st_size > 0
  assert (saved / 'saved_model.pb').is_file()
  # Only the deleted files are missing: no pin is left.
  assert sorted(os.listdir(logdir)) == sorted(set(before) - set(deleted))


def test_a_pinned_checkpoint_is_read_after_it_is_deleted(
    tiny_ckpt, tmp_path, monkeypatch):
  """restore.hold in a pinning block: hard links beside the checkpoint,
  read after its files are deleted, removed when the block ends; the pins
  of killed readers of this host are removed, not those of live or other
  hosts' readers; where links cannot be made the files are read in
  place."""
  copy = str(tmp_path / 'model.ckpt-7')
  files = ('.index', '.data-00000-of-00001')
  for suffix in files:
    shutil.copyfile(tiny_ckpt + suffix, copy + suffix)
  ended = tt.dead_pid()
  host = socket.gethostname()
  dead = '.model.ckpt-3.pin.tmp-%d@%s' % (ended, host)
  others = ['.model.ckpt-4.pin.tmp-%d@%s' % (os.getppid(), host),
            '.model.ckpt-5.pin.tmp-%d@elsewhere' % ended]
  for name in [dead] + others:
    (tmp_path / name).mkdir()
  with restore_lib.pinning():
    assert restore_lib.hold(copy) == copy
    pin = '.model.ckpt-7.pin.tmp-%d@%s' % (os.getpid(), host)
    assert sorted(os.listdir(tmp_path / pin)) == sorted(
        'model.ckpt-7' + suffix for suffix in files)
    for suffix in files:
      os.remove(copy + suffix)
    assert restore_lib.checkpoint_reader(copy).has_tensor('global_step')
  assert sorted(os.listdir(tmp_path)) == sorted(others)

  for suffix in files:
    shutil.copyfile(tiny_ckpt + suffix, copy + suffix)

  def cannot_link(src, dst):
    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src)
  monkeypatch.setattr(os, 'link', cannot_link)
  with restore_lib.pinning():
    restore_lib.hold(copy)
    assert restore_lib.read_path(copy) == copy
    assert sorted(os.listdir(tmp_path)) == sorted(
        others + ['model.ckpt-7' + suffix for suffix in files])


def test_a_pin_in_best_is_carried_across_the_trainers_swap(tiny_ckpt,
                                                           tmp_path):
  """deeplab-eval of best/ pinned its checkpoint inside best/, which the
  trainer replaces whole at a new best: the pin was deleted with the old
  folder, and the read failed as 'deleted while it was being read'."""
  from deeplab_train.runtime import validation  # pylint: disable=g-import-not-at-top
  logdir = str(tmp_path)
  for step in (7, 9):
    for suffix in ('.index', '.data-00000-of-00001'):
      shutil.copyfile(tiny_ckpt + suffix,
                      os.path.join(logdir, 'model.ckpt-%d' % step) + suffix)
  best = lambda step: {'step': step, 'metric': 'miou', 'value': step / 10}
  best_dir = validation.save_best(logdir, os.path.join(logdir, 'model.ckpt-7'),
                                  best(7))
  held = os.path.join(best_dir, 'model.ckpt-7')
  with restore_lib.pinning():
    assert restore_lib.hold(held) == held
    validation.save_best(logdir, os.path.join(logdir, 'model.ckpt-9'),
                         best(9))
    assert not os.path.exists(held + '.index')
    assert restore_lib.checkpoint_reader(held).has_tensor('global_step')
  # The reader removed its pin's copy; nothing else is left in best/.
  assert sorted(os.listdir(best_dir)) == [
      'best.json', 'checkpoint', 'model.ckpt-9.data-00000-of-00001',
      'model.ckpt-9.index']
  # best/ as a link to another disk stays a link: it was replaced by a
  # folder, and the old model stayed where it pointed.
  elsewhere = tmp_path / 'other_disk' / 'best'
  os.makedirs(str(elsewhere.parent))
  os.rename(best_dir, str(elsewhere))
  os.symlink(str(elsewhere), best_dir)
  validation.save_best(logdir, os.path.join(logdir, 'model.ckpt-7'), best(7))
  assert os.path.islink(best_dir)
  assert 'model.ckpt-7.index' in os.listdir(str(elsewhere))
  assert 'model.ckpt-9.index' not in os.listdir(str(elsewhere))


def test_files_deleted_under_a_reader_are_named_as_such(tiny_ckpt, tmp_path):
  copy = str(tmp_path / 'model.ckpt-7')
  for suffix in ('.index', '.data-00000-of-00001'):
    shutil.copyfile(tiny_ckpt + suffix, copy + suffix)
  assert restore_lib.checkpoint_reader(copy).has_tensor('global_step')
  for suffix in ('.index', '.data-00000-of-00001'):
    os.remove(copy + suffix)
  with pytest.raises(restore_lib.CheckpointGoneError) as error:
    restore_lib.checkpoint_reader(copy)
  assert error.value.prefix == copy
