"""SavedModel with a serving signature, made from the frozen graph.

Built from the frozen GraphDef so it computes exactly what the `.pb` does.
It loads in TensorFlow 2 and runs eagerly:

    model = tf.saved_model.load(path)
    serve = model.signatures['serving_default']
    out = serve(images=tf.constant(uint8_image[None]))
    labels = out['labels']            # int32 [1, H, W]
    probabilities = out['probabilities']  # float32 [1, H, W, C], if exported
"""
import tensorflow.compat.v1 as tf

from deeplab_train import atomic
from deeplab_train.export import freeze

SIGNATURE_KEY = 'serving_default'
INPUT_KEY = 'images'
LABELS_KEY = 'labels'
PROBABILITIES_KEY = 'probabilities'


def write_saved_model(frozen_graph_def, export_dir):
  """Writes a SavedModel (tag 'serve') wrapping a frozen export graph.

  Args:
    frozen_graph_def: GraphDef from `freeze.freeze`.
    export_dir: the SavedModel directory; replaced atomically if it exists.

  Returns:
    export_dir.
  """
  tmp = atomic.temp_dir_for(export_dir)
  with tf.Graph().as_default() as graph:
    tf.import_graph_def(frozen_graph_def, name='')
    names = {n.name for n in frozen_graph_def.node}
    inputs = {INPUT_KEY: graph.get_tensor_by_name(freeze.INPUT_NAME + ':0')}
    outputs = {LABELS_KEY: graph.get_tensor_by_name(freeze.OUTPUT_NAME + ':0')}
    if freeze.PROB_NAME in names:
      outputs[PROBABILITIES_KEY] = graph.get_tensor_by_name(
          freeze.PROB_NAME + ':0')
    signature = tf.saved_model.signature_def_utils.predict_signature_def(
        inputs, outputs)
    with tf.Session(graph=graph) as sess:
      builder = tf.saved_model.Builder(tmp)
      builder.add_meta_graph_and_variables(
          sess, [tf.saved_model.tag_constants.SERVING],
          signature_def_map={SIGNATURE_KEY: signature},
          strip_default_attrs=True)
      builder.save()
  return atomic.replace_dir(tmp, export_dir)
