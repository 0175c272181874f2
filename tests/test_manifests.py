"""Our training graph has exactly the variables of the original DeepLab.

For each reference manifest (the original's training graph for one
configuration, read off its code): same (name, shape) set, same trainable /
non-trainable split, same number of regularisation losses and BN update ops,
same merged-logits shape and the same "extra layer" scopes. Graph
construction only: nothing is run.
"""
import pytest

import model_testing as mt
from deeplab_train.model import deeplab
from deeplab_train.model import registry


@pytest.fixture(scope='module', params=mt.MANIFEST_NAMES)
def built(request, reference_dir):
  """(manifest, graph, outputs, recorder, ModelOptions fields the backbone
  read) for one manifest."""
  manifest = mt.load_manifest(reference_dir, request.param)
  with mt.recording_backbone_options() as read:
    graph, outputs, rec = mt.build_training_graph_from_manifest(manifest)
  return manifest, graph, outputs, rec, read


def _describe(extra, missing):
  return ('%d variables not in the manifest: %s\n%d manifest variables '
          'missing: %s' % (len(extra), sorted(extra)[:20], len(missing),
                           sorted(missing)[:20]))


def test_variable_names_and_shapes(built):
  manifest, graph, _, _, _ = built
  ours = mt.variable_shapes(graph)
  theirs = mt.manifest_variable_shapes(manifest)
  assert len(theirs) == manifest['num_variables']
  assert ours == theirs, _describe(ours - theirs, theirs - ours)


def test_trainable_split(built):
  manifest, graph, _, _, _ = built
  with graph.as_default():
    trainable = {v.op.name for v in mt.tf.trainable_variables()}
    frozen = {v.op.name for v in mt.tf.global_variables()} - trainable
  assert frozen == set(manifest['non_trainable'])
  assert len(trainable) == manifest['num_trainable']


def test_regularization_losses(built):
  manifest, _, _, rec, _ = built
  assert len(rec.regularization_losses) == (
      manifest['num_regularization_losses'])
  regularised = [_variable_read_by(loss) for loss in rec.regularization_losses]
  assert len(set(regularised)) == len(regularised)
  depthwise = [n for n in regularised if n.endswith('depthwise_weights')]
  if manifest['config']['model_variant'].startswith('nas_'):
    # The NAS cells' separable convs regularise their depthwise weights too
    # (the original's NAS arg scope), as the count above confirms.
    assert depthwise
  else:
    # Elsewhere depthwise weights are never regularised.
    assert not depthwise, depthwise[:3]


def _variable_read_by(loss):
  """The name of the variable a regularisation loss is computed from."""
  pending, seen = [loss.op], set()
  while pending:
    op = pending.pop()
    if op.type in ('VarHandleOp', 'VariableV2'):
      return op.name
    seen.add(op.name)
    pending += [t.op for t in op.inputs if t.op.name not in seen]
  raise AssertionError('no variable behind %s' % loss.op.name)


def test_batch_norm_update_ops(built):
  manifest, _, _, rec, _ = built
  assert len(rec.update_ops) == manifest['num_update_ops']


def test_merged_logits_shape(built):
  manifest, _, outputs, _, _ = built
  logits = outputs['semantic']['merged_logits']
  assert logits.shape.as_list() == manifest['merged_logits_shape']


@pytest.mark.parametrize('name', mt.MANIFEST_NAMES)
def test_extra_layer_scopes(reference_dir, name):
  manifest = mt.load_manifest(reference_dir, name)
  assert deeplab.get_extra_layer_scopes() == manifest['extra_layer_scopes']
  assert deeplab.get_extra_layer_scopes(
      last_layers_contain_logits_only=True) == (
          manifest['extra_layer_scopes_logits_only'])


def test_logits_only_scopes_select_the_logits_variables(built):
  manifest, _, _, _, _ = built
  scopes = deeplab.get_extra_layer_scopes(last_layers_contain_logits_only=True)
  selected = sorted(name for name, _ in manifest['variables']
                    if name.split('/')[0] in scopes)
  assert selected == sorted(manifest['logits_variables'])


def test_backbone_declares_the_variant_options_it_reads(built):
  """deeplab-train warns about --depth_multiplier, --multi_grid, the NAS
  flags ... given for a backbone that does not read them, by its registry
  entry's `options_read`: the fields its build function reads."""
  manifest, _, _, _, read = built
  backbone = registry.get(manifest['config']['model_variant'])
  assert read & set(registry.BACKBONE_OPTIONS) == set(backbone.options_read)
