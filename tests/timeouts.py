"""How long a test waits for a process or an event before it calls the
wait a hang.

A guard against hangs only, far above what the work takes (a TensorFlow
process's start-up, graph and a few steps: 15-35 s on an idle 2-core
machine, three times that and more on a loaded one): a wait that fails
must mean that the process is stuck, never that the machine is slow.
Waits on a process also end at once when it exits.
"""
HANG_SECONDS = 900
