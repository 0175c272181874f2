"""Training: losses, learning-rate schedules, towers, the training graph,
initialisation from a checkpoint, session hooks, the logdir lock and the
run loop behind `deeplab-train`.

- `graph.build_training_graph`: the whole graph in one call (a dict of what
  the session needs).
- `run.train`: lock, resume / initialise, train, stop, report a RunResult.
"""
