"""The profiler's runs under failures: real training processes SIGKILLed and recovered.

- ``drill`` (``python -m profiler drill``): the paper's recovery-fidelity experiment;
- ``validate`` (``python -m profiler validate``): the simulator's predictions against
  real runs killed at the times of a failure log, run by ``supervisor`` (starts the
  workers, kills them at the failure times, restarts them) and counted by ``ledger``
  (where the wall clock went, from the processes' own event logs);
- ``worker`` (``python -m profiler worker JOB.json``, internal): the training process
  of a drill or a validation, also what the restart measurement times.

GEMINI's peer process (``profiler.checkpointers.peerstore``) is part of its checkpointer, not of
these runs, and the staleness study's runs (``profiler.studyruns``) kill nothing.
"""
