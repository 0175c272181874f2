"""Data: dataset descriptors, TFRecord schema, converters, preprocessing, tf.data.

  colormap        class id -> colour tables ('pascal', 'cityscapes', 'ade20k')
  datasets        DatasetInfo, built-in datasets, dataset.json
  tfrecord        the original's tf.Example keys, shard names, encode / parse
  build           folders -> validated, sharded TFRecords (deeplab-build-data)
  build_options   its options and errors (which name option fields)
  build_inputs    lists the image/label pairs of a VOC or generic layout
  build_examples  reads, validates and encodes one pair
  stats           class pixel counts per split, their warnings, and the
                  class weights derived from them (--label_weights=auto)
  preprocess      the original's input_preprocess of one image + label
  image_ops       resize to a range, scale, pad (the original's steps)
  crop_window     scale + pad + crop + flip fused into one crop window
  pipeline        make_dataset: shards -> batched sample dicts
"""
