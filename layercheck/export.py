"""Export the composite state of a step: a model folder, or a DeepSpeed checkpoint.

``export_model`` (``--format hf``) writes ``config.json`` (the Hugging Face
config recorded when the checkpoint was created, if the model had one) and
``model.safetensors`` (every parameter and persistent buffer under its name in
the model), so ``AutoModel*.from_pretrained(out)`` loads it. From a ZeRO
directory the weights are assembled from every rank's fp32 master partitions,
cast to the module's dtype.

``export_deepspeed`` (``--format deepspeed``) writes, from a directory written
by ``ZeroLayerCheck``, the folder ``engine.save_checkpoint(out)`` would have
written at step T had the composite been the live state (``latest``,
``global_step{T}/`` with DeepSpeed's files, its ``zero_to_fp32.py``), which
``engine.load_checkpoint(out)`` loads at the same world size, ZeRO stage and
parameter groups. The files are torch.save pickles, DeepSpeed's own format;
nothing in the layercheck directory is unpickled (safetensors and JSON only).
It runs offline (one process, no torch.distributed) and needs deepspeed.

Either folder appears whole or not at all (built beside it, then renamed).
A ``layercheck_plan.json`` in it records which step each layer came from.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from .checkpoint import MODEL_CONFIG
from .dscheckpoint import RankShards, ZeroFacts, layout_for, place_partition
from .errors import CheckpointNotFound, CorruptVersion, LayerCheckError
from .manifest import ManifestView, Version, read_manifest, read_verified
from .recovery import Plan, iter_layers, make_plan, parse_safetensors
from .store import Store

__all__ = ["FORMATS", "export", "export_model", "export_deepspeed", "plan_all_ranks",
           "composite_tensors"]

FORMATS = ("hf", "deepspeed")
"""``hf``: a model folder for evaluation (the default); ``deepspeed``: a DeepSpeed checkpoint."""


def export(store: Store, out: str | os.PathLike[str], *, step: int | None = None,
           format: str = "hf", adam_step: str = "global") -> Plan:
    """Export the composite of ``step`` to folder ``out`` in ``format`` (one of
    FORMATS); ``adam_step`` applies to the DeepSpeed format (see dscheckpoint)."""
    if format == "hf":
        return export_model(store, out, step=step)
    if format == "deepspeed":
        return export_deepspeed(store, out, step=step, adam_step=adam_step)
    raise LayerCheckError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")


def export_model(store: Store, out: str | os.PathLike[str], *, step: int | None = None) -> Plan:
    """Write the composite model of ``step`` (the newest step at or before it;
    default newest) to folder ``out``."""
    target = _empty_target(out)
    view = read_manifest(store)
    if view.header is not None and "zero" in view.header:
        plan, tensors = _zero_model(store, view, step)
    else:
        plan = make_plan(store, view, step, verify=False)
        tensors = composite_tensors(store, view, plan)

    def build(staging: Path) -> None:
        save_file(tensors, staging / "model.safetensors",
                  metadata={"format": "pt", "layercheck_step": str(plan.step)})
        if store.exists(MODEL_CONFIG):
            config = json.loads(store.read(MODEL_CONFIG))
            (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_plan(staging, plan)

    _publish(target, build)
    return plan


def composite_tensors(store: Store, view: ManifestView, plan: Plan) -> dict[str, torch.Tensor]:
    """The module's weights and buffers of the composite ``plan``, by their names
    (each layer loaded verified, falling back past a corrupt version)."""
    tensors = {}
    for loaded in iter_layers(store, view, plan, view.layer_names):
        for key, tensor in loaded.tensors.items():
            kind, _, name = key.partition("/")
            if kind in ("param", "buffer"):
                tensors[name] = tensor
    return tensors


def export_deepspeed(store: Store, out: str | os.PathLike[str], *,
                     step: int | None = None, adam_step: str = "global") -> Plan:
    """Write the composite of exactly ``step`` (default: the newest step every
    rank's training state verifies at) as a DeepSpeed checkpoint folder ``out``
    (see the module doc; the layout per ZeRO stage is ``dscheckpoint``'s)."""
    target = _empty_target(out)
    view = read_manifest(store)
    if view.header is None:
        raise CheckpointNotFound(f"{store.url}: not a layercheck checkpoint (no manifest header)")
    facts = ZeroFacts.from_header(view.header, store.url)
    if importlib.util.find_spec("deepspeed") is None:
        raise LayerCheckError("--format deepspeed needs the deepspeed package, which is not "
                              "installed here: pip install deepspeed")
    plan = plan_all_ranks(store, view, step, exact=True)
    _check_world(plan, facts)
    package = _import_deepspeed()
    _, metadata = parse_safetensors(read_verified(store, _shard(plan.state, 0)), plan.state.file)
    try:
        doc = json.loads(metadata["state"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise CorruptVersion(f"{plan.state.file}: training state metadata is unreadable "
                             f"({exc})") from None
    layout = layout_for(facts, doc, plan.step, adam_step)
    tag = f"global_step{plan.step}"

    def build(staging: Path) -> None:
        folder = staging / tag
        folder.mkdir()
        for rank in range(facts.world_size):
            shards = _rank_shards(store, plan, rank)
            for name, obj in layout.rank_files(rank, shards).items():
                torch.save(obj, folder / name)
            del shards
        for name, obj in layout.final_files().items():
            torch.save(obj, folder / name)
        (staging / "latest").write_text(tag)
        _copy_recovery_scripts(package, staging)
        _write_plan(staging, plan)

    _publish(target, build)
    return plan


def plan_all_ranks(store: Store, view: ManifestView, step: int | None = None, *,
                   exact: bool = False) -> Plan:
    """The composite plan of a sharded (ZeRO) checkpoint, every rank's shards
    verified: the training state of ``step`` (``exact``) or of the newest step
    at or before it (default: the newest), and for every layer the newest
    version at or before that step whose shards all verify. Damaged versions
    are passed over, as ``ZeroLayerCheck.restore`` does, and noted in
    ``warnings``; with ``exact`` a damaged state of ``step`` is an error."""
    if not view.states:
        raise CheckpointNotFound(f"{store.url}: no recoverable step yet (training stopped before "
                                 "the base checkpoint)")
    if exact and step is not None:
        if step not in view.states:
            raise CheckpointNotFound(f"step {step} is not a recoverable step of {store.url} "
                                     f"({_steps(view)}); pass one of them, or leave out --step "
                                     "for the newest")
        candidates = [view.states[step]]
    else:
        bound = view.latest_step() if step is None else step
        candidates = [v for s, v in view.states.items() if s <= bound]
        if not candidates:
            raise CheckpointNotFound(f"no recoverable step at or before {bound} ({_steps(view)})")
    warnings: list[str] = []
    state = _intact(store, candidates, warnings, "training state")
    sources = {}
    for name in view.layer_names:
        versions = [v for v in view.versions.get(name, []) if v.step <= state.step]
        sources[name] = _intact(store, versions, warnings, f"layer {name}")
    return Plan(step=state.step, state=state, sources=sources, warnings=warnings)


def _steps(view: ManifestView) -> str:
    steps = sorted(view.states)
    return (f"recoverable steps: {', '.join(map(str, steps))}" if len(steps) <= 6 else
            f"{len(steps)} recoverable steps from {steps[0]} to {steps[-1]}")


def _shard(version: Version, rank: int) -> Version:
    """Rank ``rank``'s file of a sharded version, as a version of its own."""
    if rank >= len(version.shards):
        raise LayerCheckError(f"{version.file} has no shard of rank {rank}: the directory was not "
                              "written by ZeroLayerCheck, or by fewer ranks than its header says")
    s = version.shards[rank]
    return Version(version.step, s.file, s.bytes, s.checksum, version.layer, version.reason)


def _intact(store: Store, versions: list[Version], warnings: list[str], what: str) -> Version:
    """The newest of ``versions`` whose every shard verifies."""
    for version in sorted(versions, key=lambda v: v.step, reverse=True):
        try:
            for rank in range(len(version.shards)):
                read_verified(store, _shard(version, rank))
            return version
        except CorruptVersion as exc:
            warnings.append(f"{what}: skipping the version of step {version.step}: {exc}")
    raise CheckpointNotFound(f"{what}: no committed version intact on every rank"
                             + (f" ({len(versions)} tried, all damaged)" if versions else ""))


def _check_world(plan: Plan, facts: ZeroFacts) -> None:
    for version in [plan.state, *plan.sources.values()]:
        if len(version.shards) != facts.world_size:
            raise LayerCheckError(f"{version.file}: {len(version.shards)} shards, but the header "
                                  f"says {facts.world_size} ranks")


def _rank_shards(store: Store, plan: Plan, rank: int) -> RankShards:
    layers = {}
    for name, version in plan.sources.items():
        own = _shard(version, rank)
        layers[name], _ = parse_safetensors(read_verified(store, own), own.file)
    return RankShards(rank, layers)


def _zero_model(store: Store, view: ManifestView,
                step: int | None) -> tuple[Plan, dict[str, torch.Tensor]]:
    """The composite model of a ZeRO directory: full weights from every rank's
    master partitions (in the module's dtype) and rank 0's buffers."""
    facts = ZeroFacts.from_header(view.header or {}, store.url, deepspeed=False)
    plan = plan_all_ranks(store, view, step)
    _check_world(plan, facts)
    params = facts.parameters
    weights = {name: torch.empty(shape, dtype=facts.dtype) for name, shape in params.items()}
    flat = {name: w.view(-1) for name, w in weights.items()}
    buffers: dict[str, torch.Tensor] = {}
    for rank in range(facts.world_size):
        shards = _rank_shards(store, plan, rank)
        for sg in facts.sub_groups:
            place_partition(facts, sg, rank, shards.master(sg), flat)
        if rank == 0:
            buffers = shards.buffers()
    return plan, {**weights, **buffers}


def _import_deepspeed() -> Any:
    try:
        import deepspeed
    except Exception as exc:  # a broken install fails in many ways; all mean 'unusable'
        raise LayerCheckError(f"--format deepspeed needs the deepspeed package, which does not "
                              f"import here ({type(exc).__name__}: {exc})") from None
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


def _write_plan(folder: Path, plan: Plan) -> None:
    (folder / "layercheck_plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")


def _empty_target(out: str | os.PathLike[str]) -> Path:
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise LayerCheckError(f"{target} exists and is not empty; choose a new --out folder")
    return target


def _publish(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build`` in a staging folder beside ``target``, then rename it into place."""
    staging = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir(parents=True)
    try:
        build(staging)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
