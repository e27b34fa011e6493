"""The torch-free contract the profiler, the simulator and the dashboard share.

The profiler writes it, the simulator and the dashboard read it; none of it needs
torch, and none of it imports ``sim``, ``profiler`` or ``dashboard``:

- the trace: ``trace`` (the folder, its reading, writing and upgrade; staleness),
  ``traceschema`` (the tables' columns and their checks);
- the calibration: ``calibration`` (``costs.json``; ``FIGURES``, the schema its
  owners declare), ``figure`` (one figure and the declaration of one), ``band``
  (where a figure plausibly lies), ``measurement`` (which code measured each figure);
- the replays: ``fastreplay`` + ``replay_windows`` (one setting), ``lanes`` (many
  settings and budgets), both returning ``replayed``; ``decision`` (the decision model
  as a trace records it: K_l(t), the recorded config, the paper's defaults scaled);
- reading a file a user names: ``userfile`` (regular files only, each kind bounded:
  every torch-free reader of a trace, a costs.json, a failure log or record).

The write decision itself (``layercheck.contract.policy``, ``layercheck.contract.budget``) is the
library's: the live ``LayerCheck`` runs it, and the contract replays it.
"""
