"""python -m layercheck: inspect, plan, export and clean up checkpoint directories.

The library's command line (the simulator's is ``sim.cli``, the profiler's ``profiler.cli``).

Every expected failure (no such directory, not a checkpoint, damaged or
mismatched data, bad arguments) is one line on stderr and exit status 2. A
reader that stops reading (``| head -1``) ends a command quietly, status 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..contract.errors import LayerCheckError, OneLineParser, one_line, stdout_gone
from ..storage.format import ADAM_STEPS, EXPORT_FORMATS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m layercheck", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    p = sub.add_parser("inspect", help="layers, versions, staleness and bytes on disk")
    p.add_argument("directory")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--memory-tier", action="append", metavar="FOLDER",
                   help="a node's memory-tier folder (repeat per node; default: those under "
                        "the default location): which tier each layer would come from")
    p.add_argument("--quick", action="store_true",
                   help="check that files exist with their committed sizes; skip checksums")
    p = sub.add_parser("plan", help="which step each layer would be restored from")
    p.add_argument("directory")
    p.add_argument("--step", type=_step, help="recover at or before this step (default newest)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--memory-tier", action="append", metavar="FOLDER",
                   help="a node's memory-tier folder (repeat per node; default: those under "
                        "the default location): which tier each layer would come from")
    p = sub.add_parser("export", help="write the composite state of a step as a model folder, "
                       "a DeepSpeed or a DCP checkpoint")
    p.add_argument("directory")
    p.add_argument("--step", type=_step,
                   help="hf: the newest step at or before this one; deepspeed, dcp: exactly this "
                   "step (default: the newest)")
    p.add_argument("--out", required=True, help="a new folder")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="hf",
                   help="hf: config.json + model.safetensors for from_pretrained (default); "
                   "deepspeed: a checkpoint engine.load_checkpoint loads (ZeroLayerCheck "
                   "directories, same world size); dcp: a torch.distributed.checkpoint that "
                   "dcp.load reads into an FSDP2 model and optimizer (FsdpLayerCheck "
                   "directories, any world size)")
    p.add_argument("--adapter", action="store_true",
                   help="hf format of a PEFT LoRA directory: the adapter alone, in PEFT's layout "
                   "(adapter_config.json, adapter_model.safetensors) for "
                   "PeftModel.from_pretrained(base, out); without it, the merged model")
    p.add_argument("--adam-step", choices=ADAM_STEPS, default="global",
                   help="deepspeed format: every Adam step count set to the exported step "
                   "(default), or each layer's own, as restore() gives")
    p = sub.add_parser("gc", help="delete versions no kept step needs")
    p.add_argument("directory")
    p.add_argument("--keep", type=_positive, default=1,
                   help="newest recoverable steps to keep recoverable (default 1)")
    p.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    return parser


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: steps are >= 0")
    return value


def _positive(text: str) -> int:
    value = _step(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except (LayerCheckError, ValueError, OSError) as exc:
        if stdout_gone(exc):  # `inspect DIR | head -1`: nothing is wrong
            return 0
        print(f"layercheck: error: {one_line(str(exc))}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from ..storage.location import open_store
    store = open_store(args.directory, create=False)
    if args.command == "inspect":
        from .inspection import format_inspection, inspect_directory
        info = inspect_directory(store, verify=not args.quick)
        text = _with_tiers(store, args, info)
        print(json.dumps(info, indent=2) if args.json else format_inspection(info) + text)
    elif args.command == "plan":
        from ..storage.manifest import read_consistent, read_manifest
        from ..recovery import make_plan
        plan = read_consistent(store, lambda view: make_plan(store, view, args.step),
                               suspects=lambda plan: plan.passed_over, finish=lambda plan: plan)
        info = plan.to_dict()
        budget = ((read_manifest(store).header or {}).get("config") or {}).get("write_budget")
        if budget is not None:
            info["budget"] = _budget_on_resume(float(budget), plan.step)
        text = _with_tiers(store, args, info) if args.step is None else ""
        print(json.dumps(info, indent=2) if args.json else _format_plan(info) + text)
    elif args.command == "export":
        from .export import export
        plan = export(store, args.out, step=args.step, format=args.format,
                      adam_step=args.adam_step, adapter=args.adapter)
        for warning in plan.warnings:
            print(f"layercheck: warning: {one_line(warning)}", file=sys.stderr)
        what = f"{args.format}, the adapter alone" if args.adapter else args.format
        print(f"exported step {plan.step} to {args.out} ({what})")
    elif args.command == "gc":
        from .cleanup import collect_garbage
        from ..storage.store import is_temporary
        report = collect_garbage(store, keep=args.keep, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for warning in report.skipped:
            print(f"layercheck: warning: {one_line(warning)}", file=sys.stderr)
        unverified = (f"; kept {len(report.skipped)} version{'s' * (len(report.skipped) != 1)} "
                      "it could not verify" if report.skipped else "")
        temps = sum(map(is_temporary, report.removed_files))
        crashed = f" ({temps} left by interrupted writes)" if temps else ""
        print(f"kept steps {report.kept_steps} ({report.kept_files} files); {verb} "
              f"{len(report.removed_files)} files{crashed}, "
              f"{report.freed_bytes / 2**20:.1f} MiB{unverified}")
    return 0


def _with_tiers(store: object, args: argparse.Namespace, info: dict) -> str:
    """Adds ``tiers`` to ``info`` where memory tiers are found (``layercheck.tiers``);
    the text to print after the table."""
    from ..storage.manifest import read_manifest
    from ..tiers.inventory import default_folders, format_tier_plan, tier_plan
    folders = args.memory_tier or default_folders(store.url)  # type: ignore[attr-defined]
    if not folders:
        return ""
    info["tiers"] = tier_plan(store, read_manifest(store), folders)  # type: ignore[arg-type]
    return "\n\n" + format_tier_plan(info["tiers"])


def _budget_on_resume(write_budget: float, step: int) -> dict:
    """What budget mode does after a restore of ``step`` (``layercheck.contract.budget``)."""
    from ..contract.budget import STEPS_PER_DOUBLING
    return {"bytes_per_step": write_budget, "account_from_step": step, "k_scale": 1.0,
            "note": (f"budget mode: at most {write_budget / 1e6:,.3g} MB per step after step "
                     f"{step}, where a resumed run starts its account, every threshold at its "
                     f"base value (K factor 1); then K moves by 2^(1/{STEPS_PER_DOUBLING}) per "
                     "opportunity, up while over the budget, down while under; Smax still "
                     "forces writes")}


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


def _format_plan(info: dict) -> str:
    lines = [f"recover step {info['step']} ({info['bytes'] / 2**20:.1f} MiB to read)",
             f"{'layer':<32} {'from step':>9} {'stale':>6} {'reason':>9} {'frozen from':>11}"]
    lines += [f"{l['layer']:<32} {l['source_step']:>9} {l['staleness']:>6} {l['reason'] or '-':>9}"
              f" {_opt(l.get('frozen_from_step')):>11}" for l in info["layers"]]
    lines += [f"WARNING: {w}" for w in info["warnings"]]
    if "budget" in info:
        lines.append(info["budget"]["note"])
    return "\n".join(lines)
