"""Running a training graph as a process: the run and its role (local,
chief or worker), stop state and hooks, the logdir lock, signals, session
configuration, the cluster (parsed in cluster_spec, served in cluster) and
the result every command reports.

- `run.train`: lock, resume / initialise, train, stop, report a RunResult.
"""
