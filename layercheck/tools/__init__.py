"""Offline tools over a checkpoint directory: ``python -m layercheck`` and what it runs.

``cli`` (the command line), ``inspection`` (what a directory holds), ``export`` (a model
folder, a DeepSpeed or a DCP checkpoint of a step; ``dscheckpoint`` and ``dcpcheckpoint``
lay those out), ``cleanup`` (garbage-collect superseded versions safely). The top floor:
they may import every room, and none imports them.
"""
