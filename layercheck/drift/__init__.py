"""Drift d_l(t) on the optimizer's update path: the tracker and the kernels that sum it.

``tracker`` (``DriftTracker``: one accumulator per layer, after each optimizer step),
``adamupdate`` (Adam's update recomputed from the state the optimizer holds),
``fusedsums`` and ``fusedstep`` (the sums in one pass, or inside a fused AdamW step),
``stepkernel`` and ``kernels`` (numba kernels cut into pieces), ``parallel`` (the threads
a pass runs on). Imports ``layercheck.contract`` and ``layercheck.backends`` besides itself.
"""
