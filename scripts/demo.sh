#!/usr/bin/env bash
# The main job on the bundled sample data (data/, made by
# scripts/make_sample_data.py): convert it to TFRecords, train mobilenet_v2
# from scratch, evaluate (prints mIoU), write a few coloured predictions and
# export a frozen graph + SavedModel. Outputs go under ${WORK:-work/demo}.
# Re-running resumes: a finished training run is not repeated.
#
# Environment overrides: WORK, STEPS (default 3000), MIN_MIOU (default 0.7).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${WORK:-work/demo}"
STEPS="${STEPS:-3000}"
MIN_MIOU="${MIN_MIOU:-0.7}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
DATA=data
RECORDS="${WORK}/tfrecord"
LOGDIR="${WORK}/train"

step() { printf '\n== %s\n' "$*"; }

# The sample has background + 4 object classes drawn with PASCAL ids 1..4,
# so it is converted as a 5-class dataset: a 5-way classifier learns faster
# than a 21-way one that never sees 16 of its classes.
step "1/5 convert data/ to TFRecords in ${RECORDS}"
deeplab-build-data \
  --image_folder="${DATA}/JPEGImages" \
  --semantic_segmentation_folder="${DATA}/SegmentationClass" \
  --list_folder="${DATA}/ImageSets/Segmentation" \
  --image_format=jpg --label_format=png \
  --output_dir="${RECORDS}" \
  --dataset_name=shapes --num_classes=5 --ignore_label=255 \
  --class_names=background,red_disk,green_striped_square,blue_dotted_triangle,yellow_ring \
  --colormap=pascal --num_shards=4

# Small crops and a half-width mobilenet_v2 keep this to a few minutes on
# two CPU cores; the model flags are saved in ${LOGDIR}/deeplab_config.json,
# so eval, vis and export below need none.
step "2/5 train mobilenet_v2 for ${STEPS} steps in ${LOGDIR}"
deeplab-train \
  --train_logdir="${LOGDIR}" \
  --dataset=shapes --dataset_dir="${RECORDS}" --train_split=train \
  --model_variant=mobilenet_v2 --depth_multiplier=0.5 --output_stride=16 \
  --train_crop_size=129,129 --train_batch_size=8 \
  --min_scale_factor=0.5 --max_scale_factor=1.5 \
  --base_learning_rate=0.02 --training_number_of_steps="${STEPS}" \
  --log_steps=100 --save_interval_secs=120 \
  --result_json="${WORK}/train_result.json"

step "3/5 evaluate on the val split"
deeplab-eval \
  --checkpoint_dir="${LOGDIR}" \
  --dataset=shapes --dataset_dir="${RECORDS}" --eval_split=val \
  --eval_logdir="${WORK}/eval" --eval_result_json="${WORK}/eval_result.json"

step "4/5 coloured predictions of 6 val images in ${WORK}/vis"
deeplab-vis \
  --checkpoint_dir="${LOGDIR}" \
  --dataset=shapes --dataset_dir="${RECORDS}" --vis_split=val \
  --vis_logdir="${WORK}/vis" --max_number_of_images=6 \
  --also_save_raw_predictions

step "5/5 export a frozen graph and a SavedModel to ${WORK}/export"
deeplab-export \
  --checkpoint_path="${LOGDIR}" \
  --export_path="${WORK}/export/frozen_inference_graph.pb" \
  --saved_model_dir="${WORK}/export/saved_model" \
  --crop_size=257,257

miou=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["miou"])' \
  "${WORK}/eval_result.json")
printf '\nval mIoU %s (demo target >= %s)\n' "${miou}" "${MIN_MIOU}"
python -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' \
  "${miou}" "${MIN_MIOU}" || { echo "demo: mIoU below ${MIN_MIOU}" >&2; exit 1; }
