"""Evaluation and visualisation behind `deeplab-eval` and `deeplab-vis`.

  metrics     confusion matrix (ignore label excluded), mIoU, per-class IoU,
              precision and recall, pixel accuracy
  confusion   the confusion matrix as CSV and as a row-normalised heatmap
              PNG, the most confused class pairs
  predictor   restores a checkpoint into an inference graph (multi-scale,
              flips) for any image size
  eval_loop   run-once and follow-a-logdir evaluation, tables, JSON, summaries
  vis         coloured prediction PNGs, raw label PNGs, overlays
  legend      the colour legend of the classes (on the PNGs or legend.png)
  fonts       the font class names are drawn with (legends, the heatmap)
"""
