"""Every CLI of the project, fed malformed arguments and malformed files, answers
with one line on stderr and exit status 2, never a traceback.

Each generated command line holds exactly one malformation (an unknown option,
a value no option accepts, a path that is missing or holds garbage) on top of
arguments that are otherwise valid and cheap, so a CLI that failed to notice
would run (and the test would see exit 0). ``main(argv)`` runs in-process; a
few subprocess checks cover the ``python -m`` entry points.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import traceback
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
_SCRATCH = tempfile.TemporaryDirectory(prefix="cli-fuzz-")  # removed when the run ends
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _call(main, argv):
    """(exit status, stdout, stderr) of ``main(argv)``; an escaping exception is
    returned as status 'traceback' with the traceback as stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001 - the property is: nothing escapes
            return "traceback", out.getvalue(), traceback.format_exc()
    return code, out.getvalue(), err.getvalue()


def _assert_one_line_exit_2(main, argv):
    code, out, err = _call(main, argv)
    assert code == 2, f"{argv!r}: exit {code!r}\n{err[-3000:]}"
    assert err.endswith("\n") and err.count("\n") == 1, f"{argv!r}: stderr {err!r}"
    assert "Traceback" not in err


# -- values no option accepts ------------------------------------------------------
# printable text: a line break inside an argument is checked on its own below
text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12)
# no digit of any script (int() reads '\u0661' as 1), so never a number or a duration
not_a_number = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Nd")), max_size=12
                       ).filter(lambda s: not _is_number(s) and not s.startswith("-"))
bad_count = st.one_of(st.integers(max_value=-1).map(str), not_a_number,
                      st.sampled_from(["1.5", "1e3x", "nan", "inf", "0x10", " "]))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _garbage_file(data: bytes, name: str) -> str:
    folder = Path(tempfile.mkdtemp(prefix="fuzz-", dir=_SCRATCH.name))
    (folder / name).write_bytes(data)
    return str(folder / name)


def _garbage_folder(files: dict[str, bytes]) -> str:
    folder = Path(tempfile.mkdtemp(prefix="fuzz-", dir=_SCRATCH.name))
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return str(folder)


missing_path = st.text(alphabet="abcxyz_-", min_size=1, max_size=10).map(
    lambda s: f"/nonexistent-{s}/x")
garbage = st.binary(max_size=300)


# -- layercheck ----------------------------------------------------------------
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)

def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# values a JSON reader accepts and a careless one trips on: past int64, non-finite,
# bools for numbers, containers for scalars, hostile paths, deep nesting
hostile_value = st.one_of(
    json_value, st.integers(-(2**80), 2**80), st.floats(), st.integers(1, 300).map(_nested),
    st.sampled_from([2**63, 2**63 - 1, 2**70, 2**31, -1, 0, 1, True, False, None, "", [], {},
                     [[]], [{}], float("inf"), float("-inf"), float("nan"), 1e308, "../x",
                     "/etc/passwd", "layers/../../x", "crc32c:zz", "x" * 5000]))
record = st.fixed_dictionaries(
    {"kind": st.sampled_from(["header", "layer", "state", "resume", "drop", "other"])},
    optional={"step": hostile_value | st.integers(0, 50), "file": hostile_value | st.sampled_from(
        ["layers/a@000000001.safetensors", "states/000000001.safetensors", "../x", "/etc/passwd"]),
              "bytes": hostile_value, "checksum": hostile_value, "layer": hostile_value,
              "layers": hostile_value | st.just([{"name": "a", "kind": "block", "params": 4}]),
              "reason": hostile_value, "world_size": hostile_value, "config": hostile_value,
              "lr_peak": hostile_value, "shards": hostile_value | st.lists(
                  st.fixed_dictionaries({}, optional={"file": hostile_value, "bytes": hostile_value,
                                                      "checksum": hostile_value}), max_size=2),
              "zero": hostile_value, "fsdp": hostile_value})


def _encode(rec: dict) -> bytes:
    body = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    return f'{{"crc":"{zlib.crc32(body.encode()) & 0xFFFFFFFF:08x}","r":{body}}}\n'.encode()


@given(command=st.sampled_from(["inspect", "plan", "gc", "export"]),
       records=st.lists(record, max_size=6), tail=garbage)
@FUZZ
def test_layercheck_on_a_manifest_of_well_framed_nonsense_never_tracebacks(command, records, tail):
    """Records with valid CRCs but any content: a clean answer or one line + exit 2."""
    from layercheck.tools.cli import main
    folder = _garbage_folder({"manifest.jsonl": b"".join(map(_encode, records)) + tail})
    argv = [command, folder] + (["--out", folder + "/out"] if command == "export" else [])
    code, out, err = _call(main, argv)
    assert code in (0, 2), f"{argv!r} with {records!r}: exit {code!r}\n{err[-3000:]}"
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err


# -- one hostile value in a real checkpoint's manifest, through every command ----------------
# The record schema (layercheck.storage.format.RECORD_SCHEMAS) is what stands between a
# well-framed record and the code that uses its values: each example takes a real
# checkpoint, puts one hostile value in one field of one record (or of the backend
# facts an export parses), and runs every command on it.
_REAL: list[Path] = []
ZERO_FACTS = {"stage": 3, "sub_groups": [{"sub_group": 0, "group": 0, "layer": "model.norm",
                                          "params": [["model.norm.weight", [32]]],
                                          "partition_numel": 32}],
              "param_groups": [{"lr": 0.001}], "module_keys": ["model.norm.weight"],
              "ds_config": {}, "checkpoint": {
                  "module_dtype": "float32", "module_metadata": [["", {"version": 1}]],
                  "buffer_names": [], "shared_params": {}, "clip_grad": 0.0,
                  "loss_scale": {"scale": 1.0, "dynamic": False}, "layout": {},
                  "mp_world_size": 1, "dp_world_size": 1}}
FSDP_FACTS = {"world_size": 1, "params": {"model.norm.weight": {"shape": [32], "dim": 0}},
              "param_groups": [["model.norm.weight"]], "aliases": {}}


def _real_checkpoint() -> Path:
    """A real 4-step checkpoint of the tiny model, every layer at every step from the base
    (made once per run)."""
    if not _REAL:
        from tests.conftest import every_layer_checkpoint
        _REAL.append(every_layer_checkpoint(Path(tempfile.mkdtemp(dir=_SCRATCH.name)) / "c", 4))
    return _REAL[0]


def _paths(value, prefix=()):
    """Every place in ``value`` (a record): tuples of keys and list indices."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, (*prefix, key))


def _put(target, path, value):
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@st.composite
def hostile_manifest(draw):
    """(records of the real checkpoint with one hostile value placed, what was done)."""
    lines = (_real_checkpoint() / "manifest.jsonl").read_bytes().splitlines()
    records = [json.loads(line)["r"] for line in lines]
    where = draw(st.sampled_from(["record", "record", "facts", "append"]))
    value = draw(hostile_value)
    if where == "append":
        extra = draw(st.sampled_from([{"kind": "resume", "step": 0}, {"kind": "drop", "file": ""},
                                      {**records[-1]}, {**records[1]}]))
        key = draw(st.sampled_from(sorted(extra)))
        records.append({**extra, key: value})
        return records, f"appended {records[-1]!r:.300}"
    if where == "facts":
        name, template = draw(st.sampled_from([("zero", ZERO_FACTS), ("fsdp", FSDP_FACTS)]))
        facts = json.loads(json.dumps(template))
        path = draw(st.sampled_from([p for p in _paths(facts) if p]))
        _put(facts, path, value)
        records[0][name] = facts
        return records, f"header {name} facts {path} = {value!r:.200}"
    index = draw(st.integers(0, len(records) - 1))
    paths = [p for p in _paths(records[index]) if p] + [(draw(st.sampled_from(
        ["world_size", "config", "lr_peak", "shards", "reason", "layer"])),)]
    path = draw(st.sampled_from(paths))
    if len(path) > 1 or path[0] != "kind":
        _put(records[index], path, value)
    return records, f"record {index} {path} = {value!r:.200}"


@given(manifest=hostile_manifest())
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_layercheck_on_a_real_checkpoint_with_one_hostile_value_never_tracebacks(manifest):
    """inspect (both ways), plan (both ways), every export format and gc: each a clean
    answer or one line and exit 2."""
    import shutil

    from layercheck.tools.cli import main
    records, what = manifest
    folder = Path(tempfile.mkdtemp(dir=_SCRATCH.name)) / "c"
    shutil.copytree(_real_checkpoint(), folder)
    (folder / "manifest.jsonl").write_bytes(b"".join(map(_encode, records)))
    commands = [["inspect"], ["inspect", "--quick", "--json"], ["plan"], ["plan", "--json"],
                ["export", "--format", "hf"], ["export", "--format", "dcp"]]
    if "zero" in records[0]:
        commands.append(["export", "--format", "deepspeed"])
    for n, command in enumerate([*commands, ["gc", "--dry-run"], ["gc"]]):
        out = ["--out", str(folder.parent / f"out{n}")] if command[0] == "export" else []
        argv = [command[0], str(folder), *command[1:], *out]
        code, _, err = _call(main, argv)
        assert code in (0, 2), f"{argv!r} with {what}: exit {code!r}\n{err[-3000:]}"
        if code == 2:
            assert err.count("\n") == 1 and "Traceback" not in err, f"{what}: {err!r}"


@given(config=st.one_of(
    garbage, hostile_value.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n)))
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_export_of_a_real_checkpoint_with_any_model_config_never_tracebacks(config):
    """model_config.json holding anything: exported as config.json, or one line and exit 2."""
    import shutil

    from layercheck.tools.cli import main
    folder = Path(tempfile.mkdtemp(dir=_SCRATCH.name)) / "c"
    shutil.copytree(_real_checkpoint(), folder)
    (folder / "model_config.json").write_bytes(config)
    code, _, err = _call(main, ["export", str(folder), "--out", str(folder.parent / "out")])
    assert code in (0, 2), f"{config[:200]!r}: exit {code!r}\n{err[-3000:]}"
    if code == 2:
        assert err.count("\n") == 1 and "model_config.json" in err, err
    else:
        assert json.loads((folder.parent / "out" / "config.json").read_text()) == json.loads(config)


@given(malformed=st.one_of(
    st.tuples(st.sampled_from(["inspect", "plan", "gc", "export"]), missing_path),
    st.tuples(st.sampled_from(["inspect", "plan", "gc"]), garbage.map(
        lambda d: _garbage_folder({"manifest.jsonl": d}))),
    st.tuples(st.sampled_from(["inspect", "plan"]), garbage.map(
        lambda d: _garbage_file(d, "manifest.jsonl"))),  # a file, not a folder
    st.tuples(st.just("plan"), st.text(alphabet="abcdef:/", min_size=1, max_size=8).map(
        lambda s: f"{s}zz://{s}")),  # a URL of no known protocol
))
@FUZZ
def test_layercheck_missing_or_garbage_directories(malformed):
    from layercheck.tools.cli import main
    command, directory = malformed
    argv = [command, directory] + (["--out", "/nonexistent/o"] if command == "export" else [])
    _assert_one_line_exit_2(main, argv)


@given(argv=st.one_of(
    st.tuples(st.sampled_from(["plan", "export"]), bad_count).map(
        lambda t: [t[0], ".", "--step", t[1]] + (["--out", "o"] if t[0] == "export" else [])),
    bad_count.map(lambda v: ["gc", ".", "--keep", v]),
    st.just(["gc", ".", "--keep", "0"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
        lambda s: s not in ("inspect", "plan", "export", "gc") and not s.startswith("-h")
        and s not in ("--help", "-")).map(lambda s: [s, "."]),
    st.sampled_from(["inspect", "plan", "export", "gc"]).map(lambda c: [c]),
    st.sampled_from(["inspect", "plan", "export", "gc"]).map(lambda c: [c, ".", "--zz"]),
    st.just(["export", "."]),
    st.just([]),
))
@FUZZ
def test_layercheck_malformed_arguments(argv):
    from layercheck.tools.cli import main
    _assert_one_line_exit_2(main, argv)


# -- sim -------------------------------------------------------------------------
bad_duration = st.one_of(not_a_number, st.sampled_from(
    ["0h", "-1h", "nan", "infh", "1e400h", "h", "5parsecs", "", "0", "-30m", "1..2h"]))
bad_positive = st.one_of(not_a_number, st.sampled_from(["0", "-1", "nan", "-inf", "inf", "-0.5"]))
SIM_BASE = ["--mtbf", "1h", "--seeds", "1", "--window", "6h", "--preset", "llama-3.2-1b"]


@given(option=st.one_of(
    st.tuples(st.sampled_from(["--mtbf", "--window", "--restart"]), bad_duration),
    st.tuples(st.sampled_from(["--write-gbps", "--read-gbps", "--host-copy-gbps", "--peer-gbps",
                               "--layercheck-step-fraction", "--diff-fraction"]), bad_positive),
    st.tuples(st.sampled_from(["--seeds"]), bad_count.filter(lambda v: v != "0") | st.just("0")),
    st.tuples(st.just("--preset"), text),
    st.tuples(st.just("--strategies"), st.text(alphabet="abcxyz,", min_size=1, max_size=10)),
    st.tuples(st.just("--interval"), st.text(alphabet="abcxyz-.", min_size=1, max_size=6)),
    st.tuples(st.just("--trace"), missing_path),
    st.tuples(st.just("--trace"), st.dictionaries(
        st.sampled_from(["manifest.json", "steps.parquet", "writes.parquet", "layers.parquet"]),
        garbage, min_size=1).map(_garbage_folder)),
    st.tuples(st.just("--failure-log"), garbage.map(lambda d: _garbage_file(d, "log.csv"))),
    st.tuples(st.just("--zz-unknown"), text),
))
@FUZZ
def test_sim_run_malformed(option):
    from sim.cli import main
    flag, value = option
    base = SIM_BASE[:-2] if flag in ("--preset", "--trace") else SIM_BASE  # one scenario source
    extra = ["--failures", "log"] if flag == "--failure-log" else []
    _assert_one_line_exit_2(main, ["run", *base, flag, value, *extra])


@given(option=st.one_of(
    st.tuples(st.just("--points"), bad_count | st.sampled_from(["0", "1"])),
    st.tuples(st.just("--mtbf"), st.one_of(
        bad_duration.filter(lambda d: ".." not in d),
        bad_duration.filter(lambda d: ".." not in d).map(lambda d: f"{d}..1h"),
        st.just("3h..1h"))),
))
@FUZZ
def test_sim_sweep_malformed(option):
    from sim.cli import main
    out = tempfile.mkdtemp(prefix="fuzz-sweep-", dir=_SCRATCH.name)
    _assert_one_line_exit_2(main, ["sweep", "--seeds", "1", "--window", "6h", "--points", "2",
                                   "--out", out, *option])


LANL_HEADER = (b"System,machine type,nodes,procstot,procsinnode,nodenum,nodenumz,node install,"
               b"node prod,node decom,fru type,mem,cputype,memtype,num intercon,purpose,"
               b"Prob Started,Prob Fixed,Down Time,Facilities,Hardware,Human Error,Network,"
               b"Undetermined,Software,Same Event\n")
PHILLY_HEADER = (b"job_id,num_gpus,attempt_idx,attempt_start,attempt_end,next_start,"
                 b"restart_gap_s,attempt_len_s\n")
# a record whose header is right and whose rows are garbage (or a half-right row)
record_file = st.tuples(st.sampled_from([LANL_HEADER, PHILLY_HEADER, b"node,time\n", b""]),
                        st.one_of(garbage, st.sampled_from([
                            b"18,cluster,x,4,4,0,0,a,b,c,d,e,f,g,h,i,6/21/2005 10:54,,6,,,,,,,No\n",
                            b"18,cluster,1024,4,4,0,y,a,b,c,d,e,f,g,h,i,6/21/2005 10:54,,6,,,,,,,No\n",
                            b"a,4,0,s,e,n,7,-1\n", b"-1,1h\n0,2h\n", b"0,1h\n0,1h\n"]))
                        ).map(lambda parts: _garbage_file(parts[0] + parts[1], "record.csv"))
NODES_BASE = ["--seeds", "1", "--window", "6h", "--preset", "llama-3.2-1b"]


@given(option=st.one_of(
    st.tuples(st.just("--nodes"), bad_count | st.sampled_from(["0", "2000000"])),
    st.tuples(st.just("--node-mtbf"), bad_duration),
    st.tuples(st.just("--domain"), st.one_of(text, st.tuples(
        st.sampled_from(["rack", "switch", "pdu", ""]), bad_count | st.just("1"), bad_duration
    ).map(":".join))),
    st.tuples(st.just("--failure-log"), record_file),
))
@FUZZ
def test_sim_nodes_malformed(option):
    from sim.cli import main
    flag, value = option
    good = {"--nodes": ["--nodes", "8"], "--node-mtbf": ["--node-mtbf", "1h"]}
    if flag == "--failure-log":
        good.pop("--node-mtbf")
    good.pop(flag, None)
    _assert_one_line_exit_2(main, ["run", *NODES_BASE, *sum(good.values(), []), flag, value])


@given(record=st.one_of(record_file, missing_path), system=st.sampled_from([[], ["--system", "18"]]))
@FUZZ
def test_sim_fit_failures_malformed(record, system):
    from sim.cli import main
    _assert_one_line_exit_2(main, ["fit-failures", record, *system])


# -- sim: every numeric flag at its extremes ----------------------------------------------
# Every numeric flag of every `python -m sim` command, driven with values at and past the
# edges of float64 and of int64, and every number a failure log or node record holds:
# the command runs (exit 0) or refuses in one line (exit 2) that names the flag's range,
# never a traceback or an overflow warning. A numeric flag added to a command without a
# row here fails `test_every_numeric_flag_of_sim_is_fuzzed`.
EXTREMES = ("0", "-1", "1.5", "1e-300", "5e-324", "1e307", "1e308", "inf", "-inf", "nan",
            "9" * 30, "9" * 400, "-" + "9" * 30)
DURATION_EXTREMES = (*EXTREMES, "1e307s", "1e-300s", "1e300d", "1e-320s", "1e18s", "1e-9s")
# a job that runs in a tenth of a second, so that each accepted extreme runs for real
TINY = ["--iteration-time", "6s", "--iterations", "100", "--window", "1h", "--seeds", "1",
        "--strategies", "deepspeed"]
RUN = ["run", *TINY, "--mtbf", "1h"]
SCALE = ["scale", "--iteration-time", "6s", "--iterations", "100", "--window", "1h", "--seeds",
         "2", "--strategies", "deepspeed", "--gpus", "8"]
_TINY_TRACE: list[str] = []


def _tiny_trace() -> str:
    """The first 20 steps of traces/minilm-200steps (made once): `tune` replays its grid of
    settings over a trace in about a second instead of eight."""
    if not _TINY_TRACE:
        import dataclasses

        from layercheck.contract.trace import read_trace, write_trace
        full = read_trace(ROOT / "traces/minilm-200steps")
        cut = {name: getattr(full, name)[getattr(full, name)["step"] <= 20].copy()
               for name in ("steps", "drift", "writes")}
        folder = Path(tempfile.mkdtemp(dir=_SCRATCH.name)) / "tiny"
        write_trace(dataclasses.replace(full, **cut, recovery=None, drill=None, staleness=None),
                    folder)
        _TINY_TRACE.append(str(folder))
    return _TINY_TRACE[0]


def _without(argv: list[str], *flags: str) -> list[str]:
    out = list(argv)
    for flag in flags:
        at = out.index(flag)
        del out[at:at + 2]
    return out


def _sweep_out() -> str:
    return tempfile.mkdtemp(prefix="fuzz-sweep-", dir=_SCRATCH.name)


def _sim_rows() -> list[tuple[str, str, tuple[str, ...], object]]:
    """(command, flag, values, argv of a value): each numeric flag in a context where it is used."""
    from sim.scenarioargs import COST_FLAGS

    from sim.calibrated import FIGURES
    n, d = EXTREMES, DURATION_EXTREMES
    no_mtbf = _without(RUN, "--mtbf")
    rows = [
        ("run", "--mtbf", d, lambda v: [*no_mtbf, f"--mtbf={v}"]),
        ("run", "--iteration-time", d, lambda v: [*_without(RUN, "--iteration-time"),
                                                  f"--iteration-time={v}"]),
        ("run", "--iterations", n, lambda v: [*_without(RUN, "--iterations"), f"--iterations={v}"]),
        ("run", "--checkpoint-cost", d, lambda v: [*RUN, f"--checkpoint-cost={v}"]),
        ("run", "--checkpoint-gb", n, lambda v: [*RUN, f"--checkpoint-gb={v}"]),
        ("run", "--gpus", n, lambda v: [*no_mtbf, "--gpu-mtbf", "1000h", f"--gpus={v}"]),
        ("run", "--gpu-mtbf", d, lambda v: [*no_mtbf, "--gpus", "8", f"--gpu-mtbf={v}"]),
        ("run", "--shape", n, lambda v: [*RUN, "--failures", "weibull", f"--shape={v}"]),
        ("run", "--shape", n, lambda v: [*no_mtbf, "--nodes", "4", "--node-mtbf", "1000h",
                                         "--failures", "weibull", f"--shape={v}"]),
        ("run", "--nodes", n, lambda v: [*no_mtbf, "--node-mtbf", "1000h", f"--nodes={v}"]),
        ("run", "--node-mtbf", d, lambda v: [*no_mtbf, "--nodes", "4", f"--node-mtbf={v}"]),
        ("run", "--domain", n, lambda v: [*no_mtbf, "--nodes", "4", "--node-mtbf", "1000h",
                                          f"--domain=rack:{v}:100d"]),
        ("run", "--domain", d, lambda v: [*no_mtbf, "--nodes", "4", "--node-mtbf", "1000h",
                                          f"--domain=rack:2:{v}"]),
        ("run", "--system", n, lambda v: [*no_mtbf, "--nodes", "64", "--failure-log", "lanl",
                                          f"--system={v}"]),
        ("run", "--seeds", n, lambda v: [*_without(RUN, "--seeds"), f"--seeds={v}"]),
        ("run", "--seed", n, lambda v: [*RUN, f"--seed={v}"]),
        ("run", "--interval", n, lambda v: [*RUN, f"--interval={v}"]),
        ("run", "--stale-cost", n, lambda v: [*RUN, f"--stale-cost={v}"]),
        ("run", "--window", d, lambda v: [*_without(RUN, "--window"), f"--window={v}"]),
        ("run", "--restart", d, lambda v: [*RUN, f"--restart={v}"]),
        ("run", "--workers", n, lambda v: [*RUN, f"--workers={v}"]),
        *[("run", "--" + flag.replace("_", "-"), n,
           lambda v, flag=flag: [*RUN, f"--{flag.replace('_', '-')}={v}"]) for flag in COST_FLAGS],
        *[("run", "--cost", n, lambda v, figure=figure: [*RUN, f"--cost={figure}={v}"])
          for figure in FIGURES],
        *[("run", flag, n, lambda v, flag=flag: [*RUN, f"{flag}={v}"])
          for flag in ("--max-gb", "--max-write-share", "--max-host-gb", "--gpu-hour-usd",
                       "--storage-usd-per-gb-month", "--write-usd-per-gb", "--keep")],
        ("frontier", "--mtbf", d, lambda v: ["frontier", *TINY, f"--mtbf={v}"]),
        ("sweep", "--points", n, lambda v: ["sweep", *TINY, "--mtbf", "1h..2h", "--out",
                                            _sweep_out(), f"--points={v}"]),
        ("sweep", "--mtbf", d, lambda v: ["sweep", *TINY, "--points", "2", "--out", _sweep_out(),
                                          f"--mtbf={v}..2h"]),
        ("sweep", "--mtbf", d, lambda v: ["sweep", *TINY, "--points", "2", "--out", _sweep_out(),
                                          f"--mtbf=1s..{v}"]),
        ("sensitivity", "--mtbf", d, lambda v: ["sensitivity", *TINY, "--figures", "restart_s",
                                                f"--mtbf={v}"]),
        ("sensitivity", "--window", d, lambda v: ["sensitivity", *_without(TINY, "--window"),
                                                  "--mtbf", "1h", "--figures", "restart_s",
                                                  f"--window={v}"]),
        ("sensitivity", "--seeds", n, lambda v: ["sensitivity", *_without(TINY, "--seeds"),
                                                 "--mtbf", "1h", "--figures", "restart_s",
                                                 f"--seeds={v}"]),
        ("fit-failures", "--system", n, lambda v: ["fit-failures", "lanl", f"--system={v}"]),
        ("fit-failures", "--cofailure-window", d, lambda v: ["fit-failures", "lanl", "--system",
                                                             "18", f"--cofailure-window={v}"]),
        ("scale", "--gpus", n, lambda v: [*_without(SCALE, "--gpus"), f"--gpus={v}"]),
        ("scale", "--gpus", n, lambda v: [*_without(SCALE, "--gpus"), f"--gpus=8..{v}"]),
        ("scale", "--iteration-time", d, lambda v: [*_without(SCALE, "--iteration-time"),
                                                    f"--iteration-time={v}"]),
        ("scale", "--iterations", n, lambda v: [*_without(SCALE, "--iterations"),
                                                f"--iterations={v}"]),
        ("scale", "--seeds", n, lambda v: [*_without(SCALE, "--seeds"), f"--seeds={v}"]),
        ("scale", "--window", d, lambda v: [*_without(SCALE, "--window"), f"--window={v}"]),
        ("scale", "--domain", n, lambda v: [*SCALE, f"--domain=rack:{v}:100d"]),
        ("scale", "--domain", d, lambda v: [*SCALE, f"--domain=rack:2:{v}"]),
        *[("scale", flag, n, lambda v, flag=flag: [*SCALE, f"{flag}={v}"])
          for flag in ("--checkpoint-gb", "--interval", "--stale-cost", "--seed", "--node-shape",
                       "--spares", "--hang-share", "--aggregate-gbps", "--read-aggregate-gbps",
                       "--tenants")],
        *[("scale", flag, d, lambda v, flag=flag: [*SCALE, f"{flag}={v}"])
          for flag in ("--node-mtbf", "--hang-timeout", "--comm-init-per-doubling")],
    ]
    return rows


SLOW_EXTREMES = ("0", "-1", "5e-324", "1e308", "nan", "9" * 400)
SLOW_DURATION_EXTREMES = (*SLOW_EXTREMES, "1e307s", "1e18s")
"""The extremes of the slower commands: one of each kind (zero, negative, subnormal,
float64's largest, not a number, past float64), each accepted one costing a run."""


def _slow_sim_rows() -> list[tuple[str, str, tuple[str, ...], object]]:
    """The rows of the commands that take seconds a run (`tune` on the tiny trace,
    `paper` on its fixed scenario, `presets --write`)."""
    n, d = SLOW_EXTREMES, SLOW_DURATION_EXTREMES
    tune = ["tune", "--mtbf", "1h", "--seeds", "2", "--window", "1h"]
    paper = ["paper", "--seeds", "1", "--window", "1h"]
    return [
        *[("tune", flag, n, lambda v, flag=flag: [*tune, "--trace", _tiny_trace(), f"{flag}={v}"])
          for flag in ("--max-gb", "--max-staleness", "--max-write-share")],
        ("tune", "--mtbf", d, lambda v: [*_without(tune, "--mtbf"), "--trace", _tiny_trace(),
                                         f"--mtbf={v}"]),
        ("tune", "--seeds", n, lambda v: [*_without(tune, "--seeds"), "--trace", _tiny_trace(),
                                          f"--seeds={v}"]),
        ("tune", "--window", d, lambda v: [*_without(tune, "--window"), "--trace", _tiny_trace(),
                                           f"--window={v}"]),
        ("paper", "--mtbf", d, lambda v: [*paper, f"--mtbf={v}"]),
        ("paper", "--window", d, lambda v: [*_without(paper, "--window"), f"--window={v}"]),
        ("paper", "--seeds", n, lambda v: [*_without(paper, "--seeds"), f"--seeds={v}"]),
        ("paper", "--seed", n, lambda v: [*paper, f"--seed={v}"]),
        ("presets", "--seed", n, lambda v: ["presets", "--write", f"--seed={v}"]),
    ]


def _call_strict(main, argv):
    """``_call`` recording every warning (each one, however often it repeats)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = _call(main, argv)
    noisy = [f"{w.category.__name__}: {w.message}" for w in caught
             if issubclass(w.category, (RuntimeWarning, OverflowError))]
    return code, out, err, noisy


def _assert_sim_clean(argv):
    from sim.cli import main
    code, _, err, noisy = _call_strict(main, argv)
    assert code in (0, 2), f"{argv!r}: exit {code!r}\n{err[-3000:]}"
    assert "Traceback" not in err and not noisy, f"{argv!r}: {noisy} {err[-2000:]}"
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("python -m sim"), f"{argv!r}: {err!r}"


def _row_id(row) -> str:
    return f"{row[0]} {row[1]}"


NON_NUMERIC = {"-h", "--preset", "--trace", "--regime", "--failures", "--failure-log",
               "--strategies", "--protocol", "--engine", "--costs", "--scheduler", "--out",
               "--json", "--csv", "--figures", "--write", "--log-once", "--stale-as-useful",
               "--no-spare", "--placement", "--no-bands", "--no-baselines", "--wide", "--progress"}
"""Options that take a name, a path or nothing (a failure log's numbers are fuzzed below)."""


def test_every_numeric_flag_of_sim_is_fuzzed():
    """Each command's options are either NON_NUMERIC or have a row (the scenario flags
    that run, sweep, tune and sensitivity share through sim.scenarioargs: a row of run)."""
    import argparse

    from sim.cli import _parser
    from sim.scenarioargs import add_budget_args, add_scenario_args
    shared = argparse.ArgumentParser()
    add_scenario_args(shared)
    add_budget_args(shared, staleness=True)
    shared = {s for a in shared._actions for s in a.option_strings} | {"--workers"}
    covered = {(c, f) for c, f, _, _ in _sim_rows() + _slow_sim_rows()}
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for command, parser in sub.choices.items():
        for action in parser._actions:
            flag = action.option_strings[0] if action.option_strings else None
            if flag is None or flag in NON_NUMERIC or (command, flag) in covered:
                continue
            if flag in shared and command in ("sweep", "tune", "sensitivity", "frontier") \
                    and ("run", flag) in covered:
                continue
            missing.append(f"{command} {flag}")
    assert not missing, f"numeric flags without a fuzz row: {missing}"


@pytest.mark.parametrize("row", _sim_rows(), ids=_row_id)
def test_sim_numeric_flags_at_their_extremes(row):
    _, _, values, argv = row
    for value in values:
        _assert_sim_clean(argv(value))


@pytest.mark.parametrize("row", _slow_sim_rows(), ids=_row_id)
def test_sim_numeric_flags_of_the_slower_commands_at_their_extremes(row, monkeypatch):
    import sim.presets
    monkeypatch.setattr(sim.presets, "TRACES_DIR", Path(tempfile.mkdtemp(dir=_SCRATCH.name)))
    _, _, values, argv = row
    for value in values:
        _assert_sim_clean(argv(value))


number_text = st.one_of(st.floats().map(repr), st.integers(-(2**70), 2**70).map(str),
                        st.integers(0, 400).map(lambda k: "9" * k + "1"),
                        st.floats(-1e-290, 1e-290).map(repr))
duration_text = st.tuples(number_text, st.sampled_from(["", "s", "ms", "m", "h", "d"])).map("".join)


@given(data=st.data(), row=st.sampled_from(_sim_rows()))
@FUZZ
def test_sim_numeric_flags_with_any_number(data, row):
    """Any float or integer (with or without a duration's unit) in any numeric flag."""
    _, _, values, argv = row
    value = data.draw(duration_text if values is DURATION_EXTREMES else number_text)
    _assert_sim_clean(argv(value))


@pytest.mark.parametrize("value", DURATION_EXTREMES)
def test_sim_failure_log_and_record_numbers_at_their_extremes(value):
    """A job's failure log and a record of nodes holding each extreme as a time or a node."""
    def csv(text: str) -> str:
        return _garbage_file(text.encode(), "record.csv")
    no_mtbf = _without(RUN, "--mtbf")
    for log in (f"time\n1\n{value}\n", f"time_s\n{value}\n2\n3\n"):
        _assert_sim_clean([*no_mtbf, "--failure-log", csv(log)])
        _assert_sim_clean([*no_mtbf, "--failure-log", csv(log), "--log-once"])
    for record in (f"node,time\n0,1\n1,{value}\n2,5\n", f"node,time\n{value},1\n1,3\n2,5\n"):
        _assert_sim_clean([*no_mtbf, "--nodes", "4", "--failure-log", csv(record)])
        _assert_sim_clean(["fit-failures", csv(record)])


# -- profiler ---------------------------------------------------------------------
def _profiler_main():
    from profiler.cli import main
    return main


PROFILER_BASE = ["--model", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "8",
                 "--quiet"]


@given(option=st.one_of(
    st.tuples(st.sampled_from(["--steps", "--batch-size", "--seq-len", "--smax",
                               "--threads"]), bad_count | st.just("0")),
    st.tuples(st.sampled_from(["--lr", "--threshold"]), bad_positive.filter(lambda v: v != "0")),
    st.tuples(st.just("--warmup-steps"), bad_count),
    st.tuples(st.just("--device"), st.text(alphabet="abtpuxz", min_size=1, max_size=6).filter(
        lambda s: s not in ("cpu", "cuda"))),
    st.tuples(st.just("--model"), missing_path),
    st.tuples(st.just("--model"), garbage.map(lambda d: _garbage_folder({"config.json": d}))),
    st.tuples(st.just("--zz-unknown"), text),
))
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
def test_profiler_capture_malformed(option):
    main = _profiler_main()
    out = tempfile.mkdtemp(prefix="fuzz-prof-", dir=_SCRATCH.name)
    _assert_one_line_exit_2(main, ["capture", *PROFILER_BASE, "--out", out + "/t", *option])


@given(malformed=st.one_of(
    st.tuples(st.just(["heatmap"]), missing_path),
    st.tuples(st.just(["heatmap"]), st.dictionaries(
        st.sampled_from(["manifest.json", "steps.parquet", "writes.parquet"]), garbage,
        min_size=1).map(_garbage_folder)),
    st.tuples(st.just(["drill", "--from"]), st.dictionaries(
        st.sampled_from(["manifest.json", "steps.parquet"]), garbage, min_size=1).map(
        _garbage_folder)),
    st.tuples(st.just(["drill", *PROFILER_BASE, "--failures"]), bad_count | st.just("0")),
    st.tuples(st.sampled_from([["calibrate", "--trace"], ["validate", "--trace"]]),
              missing_path | st.dictionaries(
                  st.sampled_from(["manifest.json", "steps.parquet", "costs.json"]), garbage,
                  min_size=1).map(_garbage_folder)),
))
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
def test_profiler_malformed_files(malformed):
    main = _profiler_main()
    head, value = malformed
    _assert_one_line_exit_2(main, [*head, value])


def _mains():
    from layercheck.tools.cli import main as layercheck_main
    from sim.cli import main as sim_main
    return {"layercheck": layercheck_main, "sim": sim_main}


@pytest.mark.parametrize("cli,argv", [
    ("layercheck", ["plan", "/no/such\ndir"]),
    ("layercheck", ["plan", ".", "--step", "1\n2"]),
    ("layercheck", ["inspect", ".", "--zz\nzz"]),
    ("sim", ["--mtbf", "1h", "--zz\nzz"]),
    ("profiler", ["capture", "--zz\nzz"]),
])
def test_an_argument_with_a_line_break_still_gives_one_line(cli, argv):
    main = _profiler_main() if cli == "profiler" else _mains()[cli]
    _assert_one_line_exit_2(main, argv)


# -- the real entry points, as a user runs them -------------------------------------
@pytest.mark.parametrize("argv", [
    ["layercheck", "plan", "/nonexistent/ckpt"],
    ["layercheck", "gc", ".", "--keep", "-1"],
    ["sim", "--mtbf", "soon"],
    ["sim", "sweep", "--points", "x"],
    ["profiler", "capture", "--steps", "-3"],
    ["profiler", "heatmap", "/nonexistent/trace"],
])
def test_python_dash_m_entry_points(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
