"""Data: dataset descriptors, TFRecord schema, converters, preprocessing, tf.data.

  colormap    class id -> colour tables ('pascal', 'cityscapes', 'ade20k')
  datasets    DatasetInfo, built-in datasets, dataset.json
  tfrecord    the original's tf.Example keys, shard names, encode / parse
  build       folders -> validated, sharded TFRecords (deeplab-build-data)
  preprocess  the original's resize / scale / pad / crop / flip
  pipeline    make_dataset: shards -> batched sample dicts
"""
