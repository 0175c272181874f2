"""The retraining round's policy (scripts/cron_retrain.sh, docs/cron.md).

- `policy`: the pure decisions of a round (what to rebuild and train,
  promote or keep, the exit code and the JSON summary), unit-tested.
- `state`: the files those decisions read and write (state/, the eval
  results, an export's metrics.json, last_run.json).

The script asks for each decision through `python -m deeplab_train.retrain`
(deeplab_train/cli/retrain.py).
"""
