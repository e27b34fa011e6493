"""Export the composite state of a step: a model folder, a DeepSpeed or a DCP checkpoint.

``export_model`` (``--format hf``) writes ``config.json`` (the Hugging Face
config recorded when the checkpoint was created, if the model had one) and
``model.safetensors`` (every parameter and persistent buffer under its name in
the model), so ``AutoModel*.from_pretrained(out)`` loads it. From a ZeRO
directory the weights are assembled from every rank's fp32 master partitions
(each layer by the layout of its version), cast to the module's dtype; from an
FSDP2 directory, joined from every rank's slices.

``export_deepspeed`` (``--format deepspeed``) writes, from a directory written
by ``ZeroLayerCheck``, the folder ``engine.save_checkpoint(out)`` would have
written at step T had the composite been the live state (``latest``,
``global_step{T}/`` with DeepSpeed's files, its ``zero_to_fp32.py``), which
``engine.load_checkpoint(out)`` loads at the world size, ZeRO stage and
parameter groups of the layout that wrote step T's training state; a layer whose
version another layout wrote (another world size or stage, or one process) is
resharded into it (``backends.reshard.partition_tensors``). The files are
torch.save pickles, DeepSpeed's own format; nothing in the layercheck directory is unpickled (safetensors and JSON only).
It runs offline (one process, no torch.distributed) and needs deepspeed.

``export_dcp`` (``--format dcp``) writes, from a directory written by
``FsdpLayerCheck``, a torch.distributed.checkpoint folder of the composite of
step T: the model and optimizer state dicts as ``get_state_dict`` lays them
out, the LR scheduler and the step (``dcpcheckpoint``), which ``dcp.load``
reads into a fresh FSDP2 model and optimizer at any world size. Offline, one
process.

Either folder appears whole or not at all (built beside it, then renamed).
A ``layercheck_plan.json`` in it records which step each layer came from.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import torch

from .dcpcheckpoint import FsdpFacts, assemble, dcp_state, fqn, save_dcp
from .dscheckpoint import RankShards, ZeroFacts, layout_for
from ..contract.errors import LayerCheckError
from ..backends.lora import LoraFacts, adapter_weights, merged_weights
from ..storage.format import (ADAPTER_CONFIG, EXPORT_FORMATS, Layout,
                              module_tensors, parse_model_config, tensor_key)
from ..storage.layerread import read_verified
from ..backends.partitioning import Partitioning
from ..backends.reshard import gather, partition_tensors, whole_pieces
from ..storage.manifest import ManifestView, read_consistent
from ..recovery import Plan, Planner, make_plan, parse_safetensors, read_state
from ..modelfolder import composite, model_config, publish, write_adapter, write_model
from ..storage.store import Store

__all__ = ["export", "export_model", "export_deepspeed", "export_dcp"]


def export(store: Store, out: str | os.PathLike[str], *, step: int | None = None,
           format: str = "hf", adam_step: str = "global", adapter: bool = False) -> Plan:
    """Export the composite of ``step`` to folder ``out`` in ``format`` (one of
    ``format.EXPORT_FORMATS``); ``adam_step`` applies to the DeepSpeed format
    (see dscheckpoint), ``adapter`` to hf (``export_model``)."""
    if adapter and format != "hf":
        raise LayerCheckError(f"--adapter writes a PEFT adapter folder, which only --format hf "
                              f"does, not --format {format}")
    if format == "hf":
        return export_model(store, out, step=step, adapter=adapter)
    if format == "deepspeed":
        return export_deepspeed(store, out, step=step, adam_step=adam_step)
    if format == "dcp":
        return export_dcp(store, out, step=step)
    raise LayerCheckError(f"unknown export format {format!r}: use one of "
                          f"{', '.join(EXPORT_FORMATS)}")


def export_model(store: Store, out: str | os.PathLike[str], *, step: int | None = None,
                 adapter: bool = False) -> Plan:
    """Write the composite model of ``step`` (the newest step at or before it;
    default newest) to folder ``out``. A LoRA directory (``adapters``) gives the
    merged model (W + s·B·A under the base model's names), or with ``adapter`` the
    adapter alone in PEFT's layout (``adapter_config.json``,
    ``adapter_model.safetensors``) for ``PeftModel.from_pretrained(base, out)``."""
    target = _empty_target(out)
    model_config(store)  # a damaged config is refused before any layer is read

    def prepare(view: ManifestView) -> tuple[Plan, dict[str, torch.Tensor]]:
        backends = {layout.backend for layout in view.layouts.values()}  # format: layouts
        if "zero" in backends and not adapter:
            return _zero_model(store, view, step)
        if "fsdp" in backends and not adapter:
            return _fsdp_model(store, view, step)
        lora = LoraFacts.from_header(view.header, store.url)
        if adapter and lora is None:
            raise LayerCheckError(f"{store.url} was not written from a PEFT LoRA model (its "
                                  "header records no adapter): export without --adapter")
        plan, tensors = composite(store, view, step)
        if lora is None:
            return plan, tensors
        if not adapter:
            return plan, merged_weights(tensors, lora)
        config = parse_model_config(store.read(ADAPTER_CONFIG), ADAPTER_CONFIG) \
            if store.exists(ADAPTER_CONFIG) else {}
        return plan, adapter_weights(tensors, lora, str(config.get("bias", "none")))

    def build(staging: Path, plan: Plan, tensors: dict[str, torch.Tensor]) -> None:
        (write_adapter if adapter else write_model)(staging, store, plan.step, tensors)

    return _export(store, target, prepare, build)


def export_deepspeed(store: Store, out: str | os.PathLike[str], *,
                     step: int | None = None, adam_step: str = "global") -> Plan:
    """Write the composite of exactly ``step`` (default: the newest step every
    rank's training state verifies at) as a DeepSpeed checkpoint folder ``out``
    (see the module doc; the layout per ZeRO stage is ``dscheckpoint``'s)."""
    target = _empty_target(out)
    package = _import_deepspeed()

    def prepare(view: ManifestView) -> tuple[Plan, ZeroFacts, Any, Callable[[int], RankShards]]:
        view.require_header(store.url)
        planner = Planner(store, view, every_shard=True)
        plan = planner.plan(step, exact=True)
        written = _state_layout(view, plan, store.url)
        facts = ZeroFacts.from_header(written.header(), store.url)
        _, doc = read_state(store, plan.state)
        return plan, facts, layout_for(facts, doc, plan.step, adam_step), \
            lambda rank: _rank_shards(planner, plan, written, facts, rank)

    def build(staging: Path, plan: Plan, facts: ZeroFacts, layout: Any,
              shards_of: Callable[[int], RankShards]) -> None:
        # reads every shard again: one rank's shards in memory at a time
        tag = f"global_step{plan.step}"
        folder = staging / tag
        folder.mkdir()
        for rank in range(facts.world_size):
            shards = shards_of(rank)
            for name, obj in layout.rank_files(rank, shards).items():
                torch.save(obj, folder / name)
            del shards
        for name, obj in layout.final_files().items():
            torch.save(obj, folder / name)
        (staging / "latest").write_text(tag)
        _copy_recovery_scripts(package, staging)

    return _export(store, target, prepare, build)


def export_dcp(store: Store, out: str | os.PathLike[str], *, step: int | None = None) -> Plan:
    """Write the composite of exactly ``step`` (default: the newest step every
    rank's training state verifies at) as a DCP checkpoint folder ``out``
    (see the module doc; the layout is ``dcpcheckpoint``'s)."""
    target = _empty_target(out)

    def prepare(view: ManifestView) -> tuple[Plan, dict[str, Any]]:
        facts = _fsdp_facts(store, view)
        plan = make_plan(store, view, step, exact=True)
        _, doc = read_state(store, plan.state)
        return plan, dcp_state(assemble(store, view, plan, facts), facts, doc)

    def build(staging: Path, plan: Plan, state: dict[str, Any]) -> None:
        save_dcp(state, staging)

    return _export(store, target, prepare, build)


def _fsdp_model(store: Store, view: ManifestView,
                step: int | None) -> tuple[Plan, dict[str, torch.Tensor]]:
    """The composite model of an FSDP2 directory: whole weights joined from every
    rank's slices, and rank 0's buffers, under their state-dict names."""
    facts = _fsdp_facts(store, view)
    plan = make_plan(store, view, step)
    whole = assemble(store, view, plan, facts, moments=False)
    return plan, {fqn(n): t for n, t in {**whole.weights, **whole.buffers}.items()}


def _fsdp_facts(store: Store, view: ManifestView) -> FsdpFacts:
    """The FSDP2 facts of the newest FSDP2 layout (the groups and tied keys a DCP export
    lays out; every layout of one directory describes one model), or the header's
    refusal where no FSDP2 job wrote there."""
    fsdp = [layout for layout in view.layouts.values() if layout.backend == "fsdp"]
    if not fsdp:
        return FsdpFacts.from_header(view.header, store.url)  # says what --format dcp needs
    return FsdpFacts.from_header(max(fsdp, key=lambda layout: layout.id).header(), store.url)


def _state_layout(view: ManifestView, plan: Plan, url: str) -> Layout:
    """The layout of the composite's training state, which a DeepSpeed export is written
    in (its world size, stage and sub-groups); LayerCheckError with the fix where no
    ZeRO job wrote that state."""
    written = view.layout_of(plan.state)
    if written.backend != "zero":
        zero = sorted(s for s, v in view.states.items() if view.layout_of(v).backend == "zero")
        if not any(layout.backend == "zero" for layout in view.layouts.values()):
            ZeroFacts.from_header(written.header(), url)  # raises: not written by ZeRO
        raise LayerCheckError(
            f"the training state of step {plan.step} was written by {written.describe()}, "
            "which ran no DeepSpeed engine: a DeepSpeed checkpoint takes its engine state "
            "from a step a ZeRO job wrote" + (f" (steps {_listed(zero)})" if zero else "") +
            "; or export --format hf")
    return written


def _listed(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]} to {steps[-1]}"


def _rank_shards(planner: Planner, plan: Plan, written: Layout, facts: ZeroFacts,
                 rank: int) -> RankShards:
    """Rank ``rank``'s shard of every layer of ``plan`` in layout ``written``: its own
    file for a version written so, else its partitions read from the version's layout
    (``reshard.partition_tensors``: only the pieces they need, each rank's file of the
    version read and verified when first touched) and the layer's buffers."""
    target = Partitioning.from_facts(written.facts, written.world_size)
    layers = {}
    for name, version in plan.sources.items():
        if version.layout == written.id:
            if len(version.shards) != written.world_size:
                raise LayerCheckError(f"{version.file}: {len(version.shards)} shards, but its "
                                      f"layout says {written.world_size} ranks")
            own = version.per_rank()[rank]
            layers[name], _ = parse_safetensors(read_verified(planner.store, own), own.file)
            continue
        old = planner.view.layout_of(version)
        read = planner.reader(version)
        tensors = partition_tensors(read, Partitioning.from_facts(old.facts, old.world_size),
                                    target, rank, facts.of_layer(name), name)
        buffers = module_tensors(read.tensors(0), kinds=("buffer",))  # every rank's whole
        tensors.update({tensor_key("buffer", n): t.clone() for n, t in buffers.items()})
        layers[name] = tensors
    return RankShards(rank, layers)


def _zero_model(store: Store, view: ManifestView,
                step: int | None) -> tuple[Plan, dict[str, torch.Tensor]]:
    """The composite model of a ZeRO directory: each parameter's whole fp32 master
    gathered from the files of its layer's version (ZeRO partitions at any world size
    and stage, or one process's whole tensors: ``format``: layouts), cast to the
    module's dtype, and rank 0's buffers; one layer's files in memory at a time."""
    planner = Planner(store, view, every_shard=True)
    plan = planner.plan(step)
    facts = _zero_facts(store, view)
    weights: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    for layer, version in plan.sources.items():
        written = view.layout_of(version)
        source = Partitioning.from_facts(written.facts, written.world_size)
        read = planner.reader(version)
        for name, shape in facts.layer_parameters(layer).items():
            numel = math.prod(shape)
            pieces = whole_pieces(source, name, numel)
            first = pieces[0] if pieces else None
            dtype = read(first.rank, source.key("master", first.owner), 0, 0).dtype \
                if first else torch.float32
            flat = gather(read, source, pieces, "master", None, numel, dtype, layer)
            weights[name] = flat.view(shape).to(facts.dtype)
        buffers.update({n: t.clone() for n, t in
                        module_tensors(read.tensors(0), kinds=("buffer",)).items()})
    return plan, {**weights, **buffers}


def _zero_facts(store: Store, view: ManifestView) -> ZeroFacts:
    """The ZeRO facts of the newest ZeRO layout (the parameters, shapes and dtype an hf
    export writes; every layout of one directory describes one model)."""
    zero = [layout for layout in view.layouts.values() if layout.backend == "zero"]
    return ZeroFacts.from_header(max(zero, key=lambda layout: layout.id).header(), store.url,
                                 deepspeed=False)


def _import_deepspeed() -> Any:
    try:
        import deepspeed
    except Exception as exc:  # a broken install fails in many ways; all mean 'unusable'
        raise LayerCheckError(f"--format deepspeed needs the deepspeed package, which does not "
                              f"import here ({type(exc).__name__}: {exc}): pip install "
                              "deepspeed") from None
    return deepspeed


def _copy_recovery_scripts(package: Any, folder: Path) -> None:
    """DeepSpeed's recovery scripts, copied and made executable as
    ``engine._copy_recovery_script`` does (zero_to_fp32.py must exist)."""
    utils = Path(package.__file__).parent / "utils"
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        source = utils / script
        if not source.exists() and script != "zero_to_fp32.py":
            continue
        shutil.copyfile(source, folder / script)
        mode = (folder / script).stat().st_mode
        os.chmod(folder / script, mode | stat.S_IEXEC)


def _export(store: Store, target: Path, prepare: Callable[[ManifestView], tuple],
            build: Callable[..., None]) -> Plan:
    """Every format's export: ``prepare`` plans on a consistent snapshot of the
    manifest and returns ``(plan, *payload)``; ``build(staging, plan, *payload)``
    writes the format's files into a staging folder, which gets the plan too and
    is then renamed to ``target``."""
    def finish(prepared: tuple) -> Plan:
        plan = prepared[0]

        def staged(staging: Path) -> None:
            build(staging, *prepared)
            _write_plan(staging, plan)

        publish(target, staged)
        return plan

    return read_consistent(store, prepare, suspects=lambda prepared: prepared[0].passed_over,
                           finish=finish)


def _write_plan(folder: Path, plan: Plan) -> None:
    (folder / "layercheck_plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")


def _empty_target(out: str | os.PathLike[str]) -> Path:
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise LayerCheckError(f"{target} exists and is not empty; choose a new --out folder")
    return target
