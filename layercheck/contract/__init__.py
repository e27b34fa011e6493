"""The torch-free contract the profiler, the simulator and the dashboard share: the floor.

The profiler writes it, the simulator and the dashboard read it; none of it needs
torch, and it imports nothing of ours outside this folder (the library's other rooms
stand on it; ``sim`` and ``dashboard`` import nothing else of ``layercheck``):

- the decision model: ``config`` (``LayerCheckConfig``), ``policy`` (the write decision,
  K_l(t), ``lr_ratio``: pure, no I/O; the live ``LayerCheck`` runs it and the replays
  replay it), ``budget`` (the write budget's controller); ``errors`` (the library's
  errors, each saying the fix, and the one-line rule of every command line);
- the trace: ``trace`` (the folder, its reading, writing and upgrade; staleness),
  ``traceschema`` (the tables' columns and their checks);
- the calibration: ``calibration`` (``costs.json``, schema-agnostic: the simulator
  checks its figures against its strategies', ``sim.calibrated``), ``figure`` (one
  figure and the declaration of one), ``band`` (where a figure plausibly lies),
  ``measurement`` (which code measured each figure);
- the replays: ``fastreplay`` + ``replay_windows`` (one setting), ``lanes`` (many
  settings and budgets), both returning ``replayed``; ``decision`` (the decision model
  as a trace records it: K_l(t), the recorded config, the paper's defaults scaled);
- reading a file a user names: ``userfile`` (regular files only, each kind bounded:
  every torch-free reader of a trace, a costs.json, a failure log or record; the
  checkpoint's own files are opened by ``layercheck.storage.fds``, unbounded and
  never through a link).
"""
