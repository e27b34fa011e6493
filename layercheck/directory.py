"""The checkpoint directory a job opens: its header, the job's layout, what a fresh start abandons.

The coordinator writes the header once (the layers' signature, the config, the
backend's facts, a LoRA model's adapter facts; the Hugging Face config beside
it); every rank then checks that it describes this model, and learns the layout
its versions are written in (``format``: layouts; a new one is recorded with the
timeline's ``resume`` record, by ``LayerCheck``). Starting at step 0 on a
directory that holds versions would abandon them: ``refuse_to_abandon``.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .backends.lora import check_unchanged as check_adapter
from .backends.lora import describe as describe_adapters
from .contract.errors import CheckpointNotFound, LayerCheckError
from .storage.format import (ADAPTER_CONFIG, MANIFEST, MODEL_CONFIG, Layout, encode_record,
                             header_record)
from .backends.layermap import LayerMap
from .storage.manifest import ManifestView, job_layout, read_manifest, seal_torn_tail
from .backends.ranks import Ranks
from .storage.store import Store

__all__ = ["open_directory", "write_header", "refuse_to_abandon"]

log = logging.getLogger("layercheck")


def open_directory(store: Store, ranks: Ranks, layer_map: LayerMap, facts: dict[str, Any],
                   write: Callable[[dict[str, Any]], dict[str, Any]],
                   model: Any = None) -> tuple[Layout, bool]:
    """Create the header once (the coordinator, ``write(facts)``: the record appended),
    check on every rank that it describes ``layer_map`` and ``model``'s LoRA adapter
    (``lora.check_unchanged``), and return the layout this job of ``ranks`` whose
    source gives ``facts`` writes in (True: not recorded yet)."""
    view = None
    if ranks.is_coordinator:
        if seal_torn_tail(store):
            log.warning("layercheck: %s ended in a torn record (a crash mid-append); it is "
                        "skipped, and new records start on a line of their own", MANIFEST)
        view = read_manifest(store, ranks.rank)
        if view.header is None:
            view.apply(write(dict(facts)))
    ranks.barrier()
    if view is None:
        view = read_manifest(store, ranks.rank)
    if view.header is None:
        raise LayerCheckError(f"{store.url}: rank {ranks.rank} cannot see the manifest rank 0 "
                              "wrote; the directory must be shared by all ranks")
    layer_map.check_signature(view.header["layers"])
    if model is not None and view.header.get("lora") is not None:  # what its tensors mean
        config = store.read(ADAPTER_CONFIG) if store.exists(ADAPTER_CONFIG) else None
        check_adapter(view.header["lora"], config, model)
    return job_layout(view, ranks.world_size if ranks.sharded else 1, facts)


def write_header(store: Store, model: Any, layer_map: LayerMap, config: Any,
                 lr_peak: float | None, ranks: Ranks, facts: dict[str, Any]) -> dict[str, Any]:
    """Append the header of a new directory (and write the model's and the adapter's
    configs beside it); returns the record."""
    hf_config = getattr(model, "config", None)
    if hf_config is not None and hasattr(hf_config, "to_json_string"):
        store.write_atomic(MODEL_CONFIG, hf_config.to_json_string().encode())
    lora = describe_adapters(model)
    if lora is not None:  # what an export merges and PEFT's config for the adapter alone
        facts["lora"], adapter_config = lora
        if adapter_config:
            store.write_atomic(ADAPTER_CONFIG, adapter_config)
    header = header_record(layers=layer_map.signature(), config=config.to_dict(),
                           lr_peak=lr_peak,
                           world_size=ranks.world_size if ranks.sharded else None, **facts)
    store.append(MANIFEST, encode_record(header))
    return header


def refuse_to_abandon(url: str, view: ManifestView) -> None:
    """Starting at step 0 records ``resume 0``, which abandons every version in
    ``view``: refuse unless there is none."""
    newest = view.latest_step()
    if newest is not None:
        raise LayerCheckError(
            f"{url} holds checkpoints up to step {newest}: call restore() before "
            "the first step() to resume from them, or use a new directory to start over")
    steps = sorted(v.step for versions in view.versions.values() for v in versions)
    if steps:
        raise CheckpointNotFound(
            f"{url} holds {len(steps)} layer versions (steps {steps[0]} to {steps[-1]}) but "
            "no committed training state, so no step can be restored (a write that kept "
            "failing held every state back); starting at step 0 would abandon them. Look "
            f"with `python -m layercheck inspect {url}`, fix the storage, and to start over "
            "move the directory aside or use a new one")
