"""Training graphs, maths only: losses, learning-rate schedules, towers and
gradient averaging, the initialisation plan from a checkpoint, and
`graph.build_training_graph`, which returns one typed `TrainingGraph` (what
a session needs). Running it (lock, hooks, sessions, clusters, the result)
is `deeplab_train.runtime`.
"""
