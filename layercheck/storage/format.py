"""The on-disk format of a checkpoint directory, in one place. Torch-free.

    manifest.jsonl                                 the commit log: one record per line
    model_config.json                              the Hugging Face config, if the model has one
    adapter_config.json                            PEFT's adapter config, if the model is a LoRA one
    layers/<layer>@<step>[.rank<r>].safetensors    one file per layer version (per rank's shard)
    states/<step>[.rank<r>].safetensors            the training state of each committed step

Layer file keys (``tensor_key``): ``param/<name>`` (weights), ``master/<owner>``
(fp32 masters), ``optim/<field>/<owner>`` (each optimizer-state entry; scalars
as float64 0-d tensors), ``buffer/<name>``; ``<owner>`` is a parameter name, or
``sg<k>`` for ZeRO's flat partition of sub-group k.

Manifest records, one per line as ``{"crc": <crc32 of the JSON>, "r": record}``:
``header`` (layers, config, lr_peak, null where thresholds are not scaled and the
optimizer gave no LR above 0; a sharded job's ``world_size`` and backend
facts, e.g. ``zero`` or ``fsdp``; ``lora`` for a PEFT LoRA model, see below),
``layer``/``state`` (a committed version: step, file,
bytes, checksum, or ``shards``: one of those per rank), ``resume`` (a new
timeline starts at ``step``; ``timeline``, optional, its id: ``lineage``),
``drop`` (the version of ``file``, rank 0's if sharded, is retired), ``layout``
(see below). A ``layer`` or ``state`` record names exactly the files its layer,
step and shards give (``version_files``:
``layers/<layer>@<step>[.rank<r>]``, ``states/<step>[.rank<r>]``) and a layer the
header lists; one naming any other file is skipped as a damaged line, and no
deleter takes a path from a record (``version_files``, ``deletable``).

Layouts (``layercheck/1`` still: every new field is optional, and a
directory without them reads as before). A *layout* (``Layout``) is how the
versions of one job were laid out across ranks: its world size (1 for one
process) and its backend's facts (``LayerSource.header_facts()``: ``zero`` or
``fsdp``, {} for a plain module). Layout 0 is the header's own (its
``world_size``, 1 where absent, and its backend facts). A job whose world size
or backend differs from every layout already recorded appends, with the
``resume`` record that opens its timeline, ``{"kind": "layout", "id": k,
"world_size": W, "facts": {...}}`` (k: one above the highest id so far; a job
at the world size and backend of a recorded layout writes in that one). A
``layer`` or ``state`` record carries ``layout: k`` (absent: 0). A version of a
layout of W ranks has exactly W ``shards``, or, W = 1, one unsharded file
(``file``/``bytes``/``checksum``); a record that breaks this, or names a layout
not recorded before it, is skipped as a damaged line. The header never changes.

So a directory may hold versions of several layouts, and a composite may take
each layer from a version of another layout. Restore at world size W', rank r':
the training state is read from rank r''s file of the chosen state (rank 0's
where its layout has fewer ranks: the RNG of a rank that did not exist is rank
0's); a layer whose chosen version is of the running layout loads as before; one
of another layout is resharded on read (``LayerSource.apply_elastic``): the rank
reads, from the recorded shapes, shard dims and partition facts of that version's
layout, only the files of the old ranks whose slices its new shard needs, each
verified whole (size, checksum, layout, identity) before use, falling back past a
damaged one with the same rules (and the same agreement across ranks) as a
same-size restore. What a backend cannot reshard (its default: every backend
without ``apply_elastic``; FSDP2 sharded along a dim other than 0) is refused
before anything changes, naming the reason and ``resize_advice``. Retention,
``gc`` (which keeps every ``layout`` record), ``plan`` and ``inspect`` count
versions whatever their layout; each export reads a version by its own layout,
or refuses, with the reason and the fix, a combination it cannot express.

Frozen tensors (``layercheck/1`` still, as every field is optional and
older directories read as before): a layer record may carry ``frozen``, the
names of the layer's parameters that did not train (``requires_grad`` False) at
its step, and ``base``, the step of the same layer's version whose file holds
those parameters. A version with ``base`` (a *partial* version) holds only the
parameters that trained, their optimizer state and the layer's buffers; its
``frozen`` parameters come from the file of the layer's version of step
``base``, a *full* version (no ``base``: its file holds every parameter, which
every version written before frozen tensors were recorded is). A partial version is restorable only
while that full version is live and intact; a full version with ``frozen``
parameters is kept by retention and ``gc`` like the base checkpoint's. The
writer leaves a frozen parameter out of a version only if it was frozen at
every step since the full version it names and its bytes are still that
version's (its fingerprint unchanged, ``layercheck.storage.fingerprint``); one that
moved while frozen is written in that and every later version (and is not in
their ``frozen``, nor in that of a later full version); a parameter unfrozen
later is written in every version from then on, and one frozen later makes
the next version of its layer full again.
A full version may also leave out frozen parameters that come unchanged from a
pretrained model's safetensors files (``LayerCheck(pretrained=...)``,
``layercheck.storage.pretrained``): its record's ``refs`` names, per such parameter,
the file, the tensor key and the checksum of its bytes; a restore reads it
from there and verifies the checksum.

A PEFT LoRA model (``layercheck.backends.lora``) adds ``adapter_config.json`` (PEFT's
own adapter config, as ``save_pretrained`` writes it) and the header fact
``lora``: ``{"adapter": <name>, "modules": {<module path>: {"scaling": s,
"fan_in_fan_out": bool}}}``, what an export needs to merge W + s·B·A (or to
write the adapter alone in PEFT's layout) without PEFT or the live model; with
``"unsupported": <why>`` (and no modules) where the adapter is not plain LoRA
(DoRA, several adapters active), which export then refuses.

A file's safetensors metadata says what it is (``layer_metadata``: layer, step
and, sharded, rank; a training state's document its step): a record that names
another layer's, step's or rank's file is not believed (``described``).

Training state: RNG tensors and the state document (metadata ``state``,
format ``layercheck-state/2``): step, param_groups (hyper-parameters), group_members
(which parameters each group holds; absent before it was recorded), optimizer
(``{type, fields}``: its class and per-parameter state fields) and scheduler_type
(absent in older documents), scheduler, rng scalars,
``extra`` (the user's), ``engine`` (the backend's counters; None for a
plain module) and ``kept`` (absent where none: the fingerprints,
``layercheck.storage.fingerprint``, of the live tensors no version holds, ZeRO's frozen
parameters, under ``kept_key``: whole, or a ZeRO-3 rank's flat elements
``<name>[<start>:<stop>]``; a restore compares them with the live ones). ``layercheck-state/1`` of ZeroLayerCheck held both in
``extra`` as ``{"user", "_deepspeed"}``: ``read_state_document`` reads it.
"""
from __future__ import annotations

import json
import re
import time
import zlib
from typing import Any, Mapping, TypeVar

from .checksums import CHECKSUM, CHECKSUMS, Checksummer, checksum, checksum_matches
from ..contract.errors import CorruptVersion, LayerCheckError
from .layout import BACKENDS, Layout
from .lineage import TIMELINE
from .schema import Field, Schema, deeper_than, expect, integer, number, obj, shown, table
from .store import check_relative, temporary_target
from .version import Shard, Version

__all__ = ["MANIFEST", "MODEL_CONFIG", "ADAPTER_CONFIG", "FORMAT", "EXPORT_FORMATS", "ADAM_STEPS", "CHECKSUM", "CHECKSUMS", "Checksummer",
           "checksum", "checksum_matches",
           "layer_path", "layer_stem", "LAYER_STEM_MAX", "state_path", "version_files", "deletable", "tensor_key", "sub_group", "optimizer_fields", "optimizer_state",
           "module_tensors", "encode_record", "decode_line", "header_record", "resume_record",
           "drop_record", "layout_record", "check_record", "RECORD_SCHEMAS", "MAX_COUNT", "MAX_DEPTH",
           "parse_model_config", "Shard", "Version", "Layout", "BACKENDS", "layer_metadata", "described", "state_metadata", "group_members",
           "read_state_document", "kept_key", "kept_range"]

MANIFEST = "manifest.jsonl"
MODEL_CONFIG = "model_config.json"
ADAPTER_CONFIG = "adapter_config.json"
"""PEFT's adapter config of a LoRA model (see the module doc)."""
FORMAT = "layercheck/1"
STATE_FORMAT = "layercheck-state/2"
EXPORT_FORMATS = ("hf", "deepspeed", "dcp")
"""``export --format``: ``hf``, a model folder for evaluation (the default);
``deepspeed``, a DeepSpeed checkpoint; ``dcp``, a torch.distributed.checkpoint
of an FSDP2 job's model and optimizer."""
ADAM_STEPS = ("global", "own")
"""Adam step counts in a DeepSpeed export: all T (one consistent step), or each layer's own."""
T = TypeVar("T")


# -- file names --------------------------------------------------------------------
def layer_path(layer: str, step: int, rank: int | None = None) -> str:
    return f"layers/{layer_stem(layer)}@{step:09d}{_rank_suffix(rank)}.safetensors"


def state_path(step: int, rank: int | None = None) -> str:
    return f"states/{step:09d}{_rank_suffix(rank)}.safetensors"


def _rank_suffix(rank: int | None) -> str:
    return "" if rank is None else f".rank{rank:05d}"


def version_files(version: Version) -> list[str]:
    """The files the format names for ``version``, from its layer (None: a training
    state), step and number of shards alone, in the order of ``Version.files``. A
    record may name only these (the manifest's replay skips one that names any other
    file as damaged), and retention deletes only these: a deleter derives what it
    deletes, never takes a path from a record. A one-rank job writes unsuffixed files
    (the writer names a rank only where there are several), whether its record holds
    one ``shards`` entry (a sharded backend on one rank) or a plain file."""
    def name(rank: int | None) -> str:
        return state_path(version.step, rank) if version.layer is None else \
            layer_path(version.layer, version.step, rank)
    if len(version.shards) > 1:
        return [name(r) for r in range(len(version.shards))]
    return [name(None)]


_VERSION_FILE = re.compile(r"^(layers/[A-Za-z0-9._-]+@|states/)[0-9]{9,}(\.rank[0-9]{5,})?"
                           r"\.safetensors$")


def deletable(path: str) -> bool:
    """Whether ``path`` is a file ``gc`` may delete once nothing kept names it: a file
    of ``layer_path``'s or ``state_path``'s shape, or a temp file ``write_atomic`` left
    of one of those or of the manifest and configs. Never the manifest itself, the
    ``.lock``, nor any file the format does not name (a user's notes, in layers/ too)."""
    target = temporary_target(path)
    if target is None:
        return bool(_VERSION_FILE.match(path))
    return bool(_VERSION_FILE.match(target)) or target in (MANIFEST, MODEL_CONFIG, ADAPTER_CONFIG)


LAYER_STEM_MAX = 200
"""The longest file-name stem of a layer: with '@<step>.rank<r>.safetensors' and the
writer's '.<name>.<hex>.tmp' around it, a file name stays under 255 bytes."""


def layer_stem(name: str) -> str:
    """The part of a layer's file names that names the layer: ASCII letters, digits and
    '._-', anything else '_'. Not injective ('enc 0' and 'enc_0' share one; on a
    case-insensitive filesystem 'Enc' and 'enc' too): ``LayerMap`` refuses such pairs."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name) or "_"


# -- tensor keys of a layer file ------------------------------------------------------
def tensor_key(kind: str, owner: str, field: str | None = None) -> str:
    """``<kind>/<owner>`` (kind param, master or buffer), or ``optim/<field>/<owner>``."""
    return f"{kind}/{owner}" if field is None else f"{kind}/{field}/{owner}"


def kept_key(name: str, start: int | None = None, stop: int | None = None) -> str:
    """The state document's ``kept`` key of parameter ``name`` (whole), or of its flat
    elements [start, stop) (a ZeRO-3 rank's)."""
    return name if start is None else f"{name}[{start}:{stop}]"


def kept_range(key: str) -> tuple[str, tuple[int, int] | None]:
    """(parameter name, its flat element range or None for all) of a ``kept_key``."""
    match = re.fullmatch(r"(.+)\[(\d+):(\d+)\]", key)
    return (key, None) if match is None else (match[1], (int(match[2]), int(match[3])))


def sub_group(k: int) -> str:
    """The owner name of ZeRO's flat partition of sub-group ``k``."""
    return f"sg{k}"


def optimizer_fields(tensors: Mapping[str, T], owner: str) -> dict[str, T]:
    """``{field: value}`` of ``owner``'s optimizer-state entries, in file order."""
    return optimizer_state(tensors).get(owner, {})


def optimizer_state(tensors: Mapping[str, T]) -> dict[str, dict[str, T]]:
    """``{owner: optimizer_fields(tensors, owner)}`` of every owner, in one pass."""
    out: dict[str, dict[str, T]] = {}
    for key, value in tensors.items():
        kind, _, rest = key.partition("/")
        field, _, who = rest.partition("/")
        if kind == "optim":
            out.setdefault(who, {})[field] = value
    return out


def module_tensors(tensors: Mapping[str, T],
                   kinds: tuple[str, ...] = ("param", "buffer")) -> dict[str, T]:
    """The weights and buffers (``kinds``) of a layer file, under their names in the model."""
    return {key.partition("/")[2]: value for key, value in tensors.items()
            if key.partition("/")[0] in kinds}


# -- manifest records -----------------------------------------------------------------
def encode_record(record: dict[str, Any]) -> bytes:
    """One manifest line: the record's JSON with a CRC of that JSON appended."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    crc = zlib.crc32(body.encode()) & 0xFFFFFFFF
    return f'{{"crc":"{crc:08x}","r":{body}}}\n'.encode()


def decode_line(line: bytes) -> dict[str, Any]:
    """The record of one manifest line, checked against its kind's schema
    (``check_record``); ValueError saying what is wrong if it is damaged."""
    outer = json.loads(line)
    body = json.dumps(outer["r"], sort_keys=True, separators=(",", ":"))
    if f"{zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}" != outer["crc"]:
        raise ValueError("record CRC mismatch")
    return check_record(outer["r"])


def header_record(*, layers: list[dict[str, Any]], config: dict[str, Any], lr_peak: float | None,
                  world_size: int | None = None, **facts: Any) -> dict[str, Any]:
    """The first record of a directory; ``world_size`` only for sharded jobs,
    ``facts`` the backend's own (``zero`` under DeepSpeed)."""
    header = {"kind": "header", "format": FORMAT, "layers": layers, "config": config,
              "lr_peak": lr_peak, "created": time.time(), **facts}
    if world_size is not None:
        header["world_size"] = world_size
    return check_record(header)  # never a header its readers would refuse


def resume_record(step: int, timeline: str | None = None) -> dict[str, Any]:
    """The record that opens a timeline at ``step`` (``lineage``: ``timeline``, its id)."""
    record: dict[str, Any] = {"kind": "resume", "step": step}
    if timeline is not None:
        record["timeline"] = timeline
    return check_record(record)


def drop_record(key: str) -> dict[str, Any]:
    return {"kind": "drop", "file": key}


def layout_record(layout: Layout) -> dict[str, Any]:
    """The record that adds ``layout`` (id >= 1) to a directory (see the module doc)."""
    return check_record(layout.to_record())


# -- the record schema ------------------------------------------------------------------
MAX_COUNT = 2**63 - 1
"""The largest step, size or parameter count a record may hold: int64, as the readers
hold them (the ranks agree on steps in int64 tensors; file sizes are off_t)."""
MAX_WORLD = 2**31 - 1
"""The largest world size a header may name (torch.distributed's ranks are int32)."""
MAX_DEPTH = 64
"""The deepest nesting of lists and objects in a record or in ``MODEL_CONFIG``: far
beyond what layercheck writes (a ZeRO header nests 6 deep), and shallow enough for
every reader's JSON handling (``json.dumps(indent=2)`` recurses per level)."""


def _relative(value: Any) -> str | None:
    if not isinstance(value, str):
        return "a relative path (a string) is required"
    try:
        check_relative(value)
    except LayerCheckError as exc:
        return str(exc)
    return None


_COUNT = integer(0, MAX_COUNT, "an integer from 0 to 2**63-1")
_TEXT = expect(lambda v: isinstance(v, str), "a string")
_FILE = {"file": Field(_relative), "bytes": _COUNT, "checksum": expect(
    lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_-]+:[0-9a-f]+", v) is not None,
    "a string '<algorithm>:<hex digits>'")}
_VERSION = ({"shards": table(Schema(_FILE), "{file, bytes, checksum}")}, _FILE)
_LAYOUT = integer(0, MAX_WORLD, "a layout id, an integer from 0 to 2**31-1", required=False)
_LAYER_ENTRY = Schema({"name": _TEXT, "kind": _TEXT, "params": _COUNT,  # a name may be ''
                       "weight_bytes": integer(0, MAX_COUNT, "an integer from 0 to 2**63-1",
                                               required=False)})
RECORD_SCHEMAS: Mapping[str, Schema] = {
    "header": Schema({
        "layers": table(_LAYER_ENTRY, "{name, kind, params} (the model's layers)", distinct="name"),
        "format": Field(_TEXT.check, required=False),
        "config": obj(Schema({"write_budget": number(positive=True, required=False, null=True)}),
                      required=False),
        "lr_peak": number(positive=False, required=False, null=True),  # null: lr_scaling off
        "created": number(positive=False, required=False),
        "world_size": integer(1, MAX_WORLD, "an integer from 1 to 2**31-1", required=False),
        "zero": obj(Schema({}), required=False), "fsdp": obj(Schema({}), required=False),
        "lora": obj(Schema({"adapter": _TEXT, "modules": obj(Schema({}))}), required=False)}),
    "layer": Schema({"step": _COUNT, "layer": _TEXT,
                     "reason": expect(lambda v: isinstance(v, str), "a string", required=False,
                                      null=True),
                     "frozen": expect(lambda v: isinstance(v, list) and all(
                         isinstance(n, str) for n in v), "a list of parameter names",
                         required=False),
                     "base": integer(0, MAX_COUNT, "an integer from 0 to 2**63-1",
                                     required=False),
                     "refs": expect(lambda v: isinstance(v, dict) and all(
                         isinstance(r, dict) and all(isinstance(r.get(k), str) for k in
                                                     ("file", "key", "checksum"))
                         for r in v.values()), "an object of {file, key, checksum} per "
                         "parameter", required=False), "layout": _LAYOUT}, _VERSION),
    "state": Schema({"step": _COUNT, "layout": _LAYOUT}, _VERSION),
    "layout": Schema({"id": integer(1, MAX_WORLD, "an integer from 1 to 2**31-1"),
                      "world_size": integer(1, MAX_WORLD, "an integer from 1 to 2**31-1"),
                      "facts": obj(Schema({}))}),
    "resume": Schema({"step": _COUNT, "timeline": expect(
        lambda v: isinstance(v, str) and re.fullmatch(TIMELINE, v) is not None,
        "a timeline id (1 to 64 lowercase hex digits)", required=False)}),
    "drop": Schema({"file": Field(_relative)}),
}
"""The schema of each kind of manifest record (see the module doc): the types and
ranges every reader relies on, checked where the manifest is read (``decode_line``)
and on the header as it is written. Of the header's ``config`` (reported as
recorded by ``inspect``) only ``write_budget`` is used (``plan``); the backend
facts (``zero``, ``fsdp``) are checked by their own parsers where an export uses
them (``ZeroFacts``, ``FsdpFacts``), ``lora`` by ``lora.LoraFacts``. A layer
record's ``base`` must be below its ``step`` (``Version.from_record``)."""


def check_record(record: Any) -> dict[str, Any]:
    """``record`` if it is an object of a known kind, satisfies its kind's schema
    (``RECORD_SCHEMAS``) and nests at most ``MAX_DEPTH`` deep; else ValueError
    naming the kind, the field and what it must be."""
    if not isinstance(record, dict) or "kind" not in record:
        raise ValueError("record without kind")
    kind = record["kind"]
    schema = RECORD_SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        raise ValueError(f"unknown record kind {shown(kind)}")
    if deeper_than(record, MAX_DEPTH):
        raise ValueError(f"{kind} record nests deeper than {MAX_DEPTH} levels")
    wrong = schema.problem(record)
    if wrong is not None:
        raise ValueError(f"{kind} record: {wrong}")
    return record


def parse_model_config(data: bytes, name: str = MODEL_CONFIG) -> dict[str, Any]:
    """The Hugging Face config that ``MODEL_CONFIG`` (or ``name``: ``ADAPTER_CONFIG``)
    holds; CorruptVersion saying the fix unless it is a JSON object nesting at most
    ``MAX_DEPTH`` deep."""
    try:
        config = json.loads(data)
        wrong = None if isinstance(config, dict) else "not a JSON object"
    except RecursionError:
        config, wrong = None, "nested too deep to read"
    except ValueError as exc:  # not JSON, not UTF-8
        config, wrong = None, f"not JSON ({exc})"
    if wrong is None and deeper_than(config, MAX_DEPTH):
        wrong = f"nested deeper than {MAX_DEPTH} levels"
    if wrong is not None:
        if name != MODEL_CONFIG:
            raise CorruptVersion(f"{name} is {wrong}: it should be PEFT's adapter config; "
                                 "replace it with the adapter_config.json save_pretrained writes")
        raise CorruptVersion(f"{MODEL_CONFIG} is {wrong}: it should be the model's Hugging Face "
                             "config (config.json); replace it with that file, or delete it to "
                             "export the weights without a config")
    return config


# -- safetensors metadata and the state document --------------------------------------------
def layer_metadata(layer: str, step: int, rank: int | None = None) -> dict[str, str]:
    """What a layer file says it holds: the layer, the step and (sharded) the rank."""
    metadata = {"format": "layercheck-layer/1", "layer": layer, "step": str(step)}
    return metadata if rank is None else {**metadata, "rank": str(rank)}


def described(metadata: Mapping[str, str]) -> tuple[str | None, int, int | None]:
    """What a committed file's metadata says it is: (its layer, None for a training
    state; its step; its rank, None where not recorded). ValueError if unreadable."""
    rank = int(metadata["rank"]) if "rank" in metadata else None
    if str(metadata.get("format", "")).startswith("layercheck-layer/"):
        return metadata["layer"], int(metadata["step"]), rank
    return None, int(json.loads(metadata["state"])["step"]), rank


def state_metadata(document: dict[str, Any], default: Any) -> dict[str, str]:
    """The metadata of a training-state file holding ``document`` (see the module
    doc), serialised with ``default`` for values JSON lacks (tensors, numpy)."""
    try:
        text = json.dumps(document, default=default)
    except TypeError as exc:
        raise TypeError(f"layercheck: the training state of step {document.get('step')} is not "
                        f"JSON-serialisable ({exc}); keep extra state to numbers, strings, "
                        "lists and dicts") from None
    return {"format": STATE_FORMAT, "state": text}


def group_members(names: list[str]) -> str:
    """What the state document records of an optimizer parameter group
    (``group_members``, one per group): a checksum of its parameters' names."""
    return checksum("\n".join(sorted(names)).encode(), "crc32")  # fixed: older states compare


def read_state_document(metadata: Mapping[str, str]) -> dict[str, Any]:
    """The state document of a training-state file, ``extra`` and ``engine`` in
    their current places whichever format wrote it; CorruptVersion if unreadable."""
    try:
        doc = json.loads(metadata["state"])
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise CorruptVersion(f"training state metadata is unreadable ({exc})") from None
    extra = doc.get("extra")
    if metadata.get("format") != STATE_FORMAT and isinstance(extra, dict) and "_deepspeed" in extra:
        doc["extra"], doc["engine"] = extra.get("user"), extra["_deepspeed"]  # state/1 of ZeRO
    doc.setdefault("engine", None)
    return doc
