"""What a checkpoint directory holds: layers, versions, staleness, bytes, damage. Torch-free."""
from __future__ import annotations

from typing import Any

from ..contract.errors import CorruptVersion, ReadFailed
from ..storage.format import Version
from ..storage.layerread import read_verified
from ..storage.manifest import ManifestView, read_again, read_manifest
from ..storage.pretrained import Ref, read_ref
from ..storage.store import Store

__all__ = ["inspect_directory", "format_inspection", "format_size"]


def inspect_directory(store: Store, *, verify: bool = True) -> dict[str, Any]:
    """A JSON-ready description of the checkpoint in ``store`` (see ``format_inspection``).

    ``problems`` lists the damage: skipped manifest lines, and every committed
    file that is missing or of the wrong size, or (``verify``, which reads every
    file) fails its checksum or is not a safetensors file. Safe beside a running
    trainer: it describes the manifest as it was read, and reports as damage only
    what is still committed once it is done (a trainer retires a version, drop
    record first, before deleting its file; a torn last line may be an append in
    flight)."""
    with store.reading():  # a trainer's retention deletes no file meanwhile
        return _inspect(store, verify)


def _inspect(store: Store, verify: bool) -> dict[str, Any]:
    view = read_manifest(store)
    header = view.require_header(store.url)
    newest = view.latest_step()
    found = [(v, d) for v in view.all_versions() if (d := _damage(store, v, verify)
                                                       or _orphan(view, v))]
    problems = list(view.problems)
    if found or problems:
        now = read_again(store, view)
        live, still = set(now.all_versions()), set(now.problems)  # sets: linear in the lines
        problems = [p for p in problems if p in still]
        found = [(v, d) for v, d in found if v in live]
    layers = []
    for layer in header["layers"]:
        versions = view.versions.get(layer["name"], [])
        last = versions[-1].step if versions else None
        layers.append({
            "name": layer["name"], "kind": layer["kind"], "params": layer["params"],
            "versions": len(versions), "newest_version_step": last,
            "staleness": (newest - last) if newest is not None and last is not None else None,
            "bytes_on_disk": sum(v.total_bytes for v in versions),
            # only what trains (format: frozen tensors): versions that hold the trained
            # parameters alone, and the frozen ones the newest version reads elsewhere
            "partial_versions": sum(v.base is not None for v in versions),
            "frozen_params": len(versions[-1].frozen) if versions else 0,
            "frozen_from_step": versions[-1].base if versions else None})
    files = store.list("layers") + store.list("states")
    # layer versions and training states counted apart, here as in the totals below:
    # a state is a step's small training state, not a version of any layer
    live_layers = [view.layout_of(v).id for versions in view.versions.values() for v in versions]
    live_states = [view.layout_of(v).id for v in view.states.values()]
    layouts = [{"id": k, "world_size": layout.world_size, "backend": layout.backend,
                "layer_versions": live_layers.count(k), "states": live_states.count(k)}
               for k, layout in sorted(view.layouts.items())]
    return {"layouts": layouts,  # format: layouts
        "directory": store.url, "world_size": view.world_size, "newest_step": newest, "recoverable_steps": len(view.states),
        "oldest_step": min(view.states) if view.states else None,
        "layers": layers, "layer_versions": sum(len(v) for v in view.versions.values()),
        "bytes_on_disk": sum(_on_disk(store, f) for f in files),
        "config": header.get("config"), "problems": [*problems, *(d for _, d in found)]}


def _on_disk(store: Store, path: str) -> int:
    """Bytes of ``path``; 0 if it went since it was listed (a trainer retired it)."""
    try:
        return store.size(path)
    except FileNotFoundError:
        return 0


def _orphan(view: ManifestView, version: Version) -> str | None:
    """A partial version whose full version (holding its frozen parameters) is not live."""
    if version.base is None or view.base_of(version) is not None:
        return None
    return (f"{version.file}: its frozen parameters are in the layer's version of step "
            f"{version.base}, which is not committed: this version cannot be restored")


def _damage(store: Store, version: Version, verify: bool) -> str | None:
    """What is wrong with a committed file (any rank's shard), or None."""
    for shard in version.per_rank():
        if not store.exists(shard.file):
            return f"{shard.file}: committed but missing on disk"
        size = store.size(shard.file)
        if size != shard.bytes:
            return f"{shard.file}: {size} bytes on disk, {shard.bytes} committed"
        if verify:
            try:
                read_verified(store, shard)
            except (CorruptVersion, ReadFailed) as exc:  # ReadFailed says it is not damage
                return str(exc)
    for name, *where in version.refs if verify else ():  # frozen weights by reference
        try:
            read_ref(Ref(*where))
        except CorruptVersion as exc:
            return f"{version.file}: {name}: {exc}"
    return None


def format_inspection(info: dict[str, Any]) -> str:
    lines = [f"checkpoint {info['directory']}",
             f"newest recoverable step: {info['newest_step']}  "
             f"({info['recoverable_steps']} recoverable steps, oldest {info['oldest_step']})",
             f"layer versions: {info['layer_versions']:,}   training states: "
             f"{info['recoverable_steps']:,}   bytes on disk: {format_size(info['bytes_on_disk'])}",
             "",
             f"{'layer':<32} {'kind':<10} {'params':>12} {'versions':>8} {'newest':>8} "
             f"{'stale':>6} {'bytes':>10}"]
    if len(info.get("layouts", [])) > 1:  # several world sizes wrote here (format: layouts)
        lines.insert(3, "layouts: " + "; ".join(
            f"{lay['id']}: {lay['world_size']} x {lay['backend'] or 'plain'}, "
            f"{lay['layer_versions']:,} layer versions, {lay['states']:,} training states"
            for lay in info["layouts"]))
    frozen = any(layer.get("frozen_params") for layer in info["layers"])
    if frozen:
        lines[-1] += f" {'frozen':>7}"
    for layer in info["layers"]:
        lines.append(f"{layer['name']:<32} {layer['kind']:<10} {layer['params']:>12,} "
                     f"{layer['versions']:>8} {_opt(layer['newest_version_step']):>8} "
                     f"{_opt(layer['staleness']):>6} {format_size(layer['bytes_on_disk']):>10}"
                     + (f" {_frozen(layer):>7}" if frozen else ""))
    if frozen:
        lines.append("frozen: parameters that did not train, held by the version of step @N "
                     "(written once, not in every version)")
    for problem in info["problems"]:
        lines.append(f"DAMAGE: {problem}")
    return "\n".join(lines)


def _frozen(layer: dict[str, Any]) -> str:
    if not layer.get("frozen_params"):
        return "-"
    at = layer.get("frozen_from_step")
    return f"{layer['frozen_params']}@{at if at is not None else layer['newest_version_step']}"


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


def format_size(n: float) -> str:
    """``n`` bytes in binary units: '512 B', '2.1 MiB', '26.7 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
