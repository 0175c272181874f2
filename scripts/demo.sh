#!/usr/bin/env bash
# The main job on the bundled sample data (data/, made by
# scripts/make_sample_data.py): convert it to TFRecords.
# Outputs go under ${WORK:-work/demo}.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${WORK:-work/demo}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
DATA=data

# The sample has background + 4 object classes drawn with PASCAL ids 1..4,
# so it is converted as a 5-class dataset: a 5-way classifier learns faster
# than a 21-way one that never sees 16 of its classes.
deeplab-build-data \
  --image_folder="${DATA}/JPEGImages" \
  --semantic_segmentation_folder="${DATA}/SegmentationClass" \
  --list_folder="${DATA}/ImageSets/Segmentation" \
  --image_format=jpg --label_format=png \
  --output_dir="${WORK}/tfrecord" \
  --dataset_name=shapes --num_classes=5 --ignore_label=255 \
  --class_names=background,red_disk,green_striped_square,blue_dotted_triangle,yellow_ring \
  --colormap=pascal --num_shards=4
