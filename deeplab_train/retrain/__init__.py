"""The retraining round's policy (scripts/cron_retrain.sh, docs/cron.md).

- `policy`: the pure decisions of a round (what to rebuild and train,
  promote or keep, what to prune, the exit code), unit-tested.
- `records`: what a round writes down, as values (eval results, an
  export's metrics.json, checkpoint names, the JSON summary).
- `settings`: the checks of the script's settings.
- `data_folder`: the data folder's check and fingerprint.
- `state`: the files those read and write (state/, the eval results, an
  export's metrics.json, last_run.json, the folders pruned).

The script asks for each decision through `python -m deeplab_train.retrain`
(deeplab_train/cli/retrain.py).
"""
