"""Where a layer's tensors live, and what ranks agree on: the adapters of the one lifecycle.

- the model: ``layermap`` (which parameters form each layer), ``lora`` (PEFT LoRA
  adapters found, recorded and merged);
- the layer sources: ``source`` (the ``LayerSource`` protocol; ``ModuleSource``, a plain
  module), ``zeropartitions`` (a DeepSpeed ZeRO rank's partitions), ``dtensorshards``
  (an FSDP2 rank's DTensor shards), ``hostcopy`` (device to host copies);
- the ranks: ``ranks`` (minimum step, drift sums, barrier; nothing at world size 1);
- other layouts: ``partitioning`` (ZeRO's flat partition arithmetic), ``elastic`` (reading
  a version written in another layout), ``reshard`` (the tensors of a live layout
  assembled from another layout's pieces).

Imports ``layercheck.contract`` and ``layercheck.storage`` besides itself. A new backend is
a new module here (a ``LayerSource``), never a subclass that re-implements the lifecycle.
"""
