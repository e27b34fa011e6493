"""The profiler's command line, ``python -m profiler capture | drill | heatmap``.

``capture --deepspeed zero3`` trains inside a DeepSpeed ZeRO-3 engine, and
``capture --fsdp`` under PyTorch FSDP2, one process per rank: typed plainly
it starts torchrun itself (``--ranks``, default 2); under ``torchrun
--nproc_per_node N -m profiler capture --deepspeed zero3`` (or ``--fsdp``)
each process is one rank.

Bad input (an unknown model, an unreadable path, a negative count) is one
line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from layercheck.contract.errors import OneLineParser, one_line

from .checkpointers import VALIDATED
from .config import CaptureConfig, DrillConfig, ValidationConfig, ZeroConfig
from .errors import ProfilerError

__all__ = ["main"]

EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
    try:
        return args.run(args, argv)
    except (ProfilerError, FileExistsError) as exc:
        return _bad_input(exc)
    except ValueError as exc:  # ConfigError, TraceError: bad settings or a bad trace
        if type(exc).__module__.startswith(("layercheck", "profiler")):
            return _bad_input(exc)
        raise


def _bad_input(exc: BaseException) -> int:
    print(f"profiler: error: {one_line(str(exc))}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m profiler", description="Capture real training "
                           "traces with LayerCheck attached, and run recovery drills.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    cap = sub.add_parser("capture", help="train with LayerCheck attached and write a trace")
    _job_options(cap)
    cap.add_argument("--ckpt", type=Path, help="checkpoint folder (default: a temporary one, "
                     "deleted at the end)")
    cap.add_argument("--keep-ckpt", action="store_true", help="keep the checkpoint folder")
    cap.add_argument("--keep-history", action="store_true",
                     help="keep superseded layer versions in the checkpoint folder")
    cap.add_argument("--deepspeed", metavar="zero3",
                     help="train inside a DeepSpeed ZeRO-3 engine with ZeroLayerCheck, one "
                          "process per rank (starts torchrun, or runs as a rank under it)")
    cap.add_argument("--fsdp", action="store_true",
                     help="train under PyTorch FSDP2 (fully_shard per block, then the root) with "
                          "FsdpLayerCheck, one process per rank (starts torchrun, or runs as a "
                          "rank under it)")
    cap.add_argument("--ranks", type=int, help="with --deepspeed or --fsdp: ranks to start "
                     "(default 2; under torchrun, its --nproc_per_node)")
    cap.add_argument("--json", action="store_true",
                     help="print every figure of the capture as JSON (progress lines go to "
                          "stderr) instead of the summary")
    cap.add_argument("--no-calibrate", action="store_true",
                     help="skip the calibration (costs.json: what each checkpointing strategy's "
                          "mechanism costs here); `python -m profiler calibrate` does it later")
    _repeats_option(cap)
    cap.set_defaults(run=_run_capture)
    drill = sub.add_parser("drill", help="failure-free run vs a run killed and recovered")
    _job_options(drill)
    drill.add_argument("--failures", type=int, default=1, help="failures to inject (default 1)")
    drill.add_argument("--from", dest="from_trace", type=Path,
                       help="use this captured trace as the failure-free run (its settings "
                            "define the job; model options are then ignored)")
    drill.set_defaults(run=_run_drill)
    stale = sub.add_parser("staleness", help="what a stale layer costs: composite recoveries "
                           "trained on against the failure-free run (staleness.json, and the "
                           "stale_cost figure of costs.json)")
    _job_options(stale, out_help="the study's JSON (default: TRACE/staleness.json with --from, "
                                 "else runs/staleness/<model>-<steps>steps.json)")
    _staleness_options(stale)
    stale.set_defaults(run=_run_staleness)
    cal = sub.add_parser("calibrate", help="measure what each checkpointing strategy's "
                         "mechanism costs on a captured trace's job: costs.json")
    cal.add_argument("--trace", type=Path, required=True, help="a captured trace folder")
    cal.add_argument("--scratch", type=Path, help="where the measured checkpoints are written "
                     "(default: the temporary folder, where a capture writes its own)")
    cal.add_argument("--quiet", action="store_true", help="no progress lines")
    _repeats_option(cal)
    cal.set_defaults(run=_run_calibrate)
    val = sub.add_parser("validate", help="the simulator's predictions against real runs "
                         "killed at known times: validation.json")
    val.add_argument("--trace", type=Path, required=True,
                     help="a calibrated plain capture (its folder holds costs.json)")
    val.add_argument("--window", default="120", help="wall-clock length of each strategy's "
                     "real run (default 120 s; units s, m, h)")
    val.add_argument("--mtbf", default="24", help="mean time between the failures drawn "
                     "(default 24 s: 5 expected per window)")
    val.add_argument("--seed", type=int, default=0, help="seeds the failure times: repeat r "
                     "draws with seed + r (default 0)")
    val.add_argument("--repeats", type=int, default=3, help="runs per strategy, each on its "
                     "own failure log (default 3)")
    val.add_argument("--min-failures", type=int, default=5, help="the fewest failures a "
                     "run's log may have; a drawn log with fewer is redrawn (default 5)")
    val.add_argument("--probes", type=int, default=3, help="restarts the probe before each "
                     "run times, one after the other; the prediction takes their median "
                     "(default 3)")
    val.add_argument("--failures", type=Path, help="a failure log instead (CSV, one time per "
                     "row, seconds from the start)")
    val.add_argument("--interval", type=int, help="steps between the rollback strategies' "
                     "checkpoints (default: LayerCheck's mean staleness on the trace; tiered's memory "
                     "tier copies every step)")
    val.add_argument("--strategies", default=",".join(VALIDATED),
                     help=f"comma-separated, from {','.join(VALIDATED)} (default all)")
    val.add_argument("--out", type=Path, help="the JSON (default TRACE/validation.json)")
    val.add_argument("--scratch", type=Path, help="where the runs' checkpoints go "
                     "(default: the temporary folder)")
    val.add_argument("--quiet", action="store_true", help="no progress lines")
    val.set_defaults(run=_run_validate)
    heat = sub.add_parser("heatmap", help="draw a trace's drift heatmap as a PNG")
    heat.add_argument("trace", type=Path)
    heat.add_argument("--png", type=Path, help="output (default docs/img/<trace name>-drift.png)")
    heat.set_defaults(run=_run_heatmap)
    worker = sub.add_parser("worker")  # internal: the drill's training process
    worker.add_argument("job", type=Path)
    worker.set_defaults(run=_run_worker)
    return parser


def _repeats_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, help="calibration: repeats of each timed mechanism "
                   "(the median is kept; default 3)")


def _staleness_options(p: argparse.ArgumentParser) -> None:
    from .stalecost import StaleCostConfig
    d = StaleCostConfig()
    p.add_argument("--from", dest="from_trace", type=Path,
                   help="a plain captured trace: its settings define the job (model options "
                        "but --threads are then ignored); the result goes into it")
    p.add_argument("--thresholds", help="base thresholds of the recoveries (default: the job's "
                                        "own; the paper's sweep is 1e-2,1e-3,1e-4)")
    p.add_argument("--failures", type=int, default=d.failures,
                   help=f"failure steps per threshold, the stalest of each window (default {d.failures})")
    p.add_argument("--draws", type=int, default=d.draws,
                   help=f"data orders per failure step, the failure-free run's first (default {d.draws})")
    p.add_argument("--no-parts", dest="parts", action="store_false",
                   help="skip the composites whose stale part is only the blocks or only the embedding")
    p.add_argument("--no-exact", dest="exact", action="store_false",
                   help="skip the exact-state control")
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help=f"steps between held-out evaluations (default {d.eval_every})")
    p.add_argument("--eval-sequences", type=int,
                   help="held-out sequences per evaluation (default: all the corpus holds out)")
    p.add_argument("--horizons", default=",".join(map(str, d.horizons)),
                   help="steps after the failure at which phi is read, or end "
                        f"(default {','.join(map(str, d.horizons))})")
    p.add_argument("--rule",
                   help=f"how phi is read: lr, relative or steps (default {d.rule}; with "
                        "--reread, the study's own)")
    p.add_argument("--resamples", type=int, default=d.resamples,
                   help=f"bootstrap resamples of the held-out sequences (default {d.resamples})")
    p.add_argument("--figure-horizon",
                   help="the horizon of the stale_cost figure (default: the last of --horizons)")
    p.add_argument("--scratch", type=Path, help="where the LayerCheck directories go "
                   "(default /dev/shm, else the temporary folder)")
    p.add_argument("--transfer-to", type=Path, action="append", metavar="TRACE",
                   help="no study: carry the shipped capture's phi to this trace's costs.json by "
                        "the trace's composition (repeatable; a measured one is kept)")
    p.add_argument("--reread", type=Path, metavar="FILE",
                   help="no training: read the study in FILE again from its stored losses by "
                        "this code (and --rule), write it back and its stale_cost beside it")


def _job_options(p: argparse.ArgumentParser, *,
                 out_help: str = "trace folder (default traces/<model>-<steps>steps)") -> None:
    d = CaptureConfig()
    p.add_argument("--model", default=d.model,
                   help="minilm (default), tiny, posttrain, or a local Hugging Face model folder")
    p.add_argument("--steps", type=int, default=d.steps, help=f"optimizer steps (default {d.steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, help="peak LR (default 5e-5; 1e-3 for tiny, 5e-4 for posttrain)")
    p.add_argument("--threshold", type=float, help="LayerCheck base threshold (default: the "
                   "paper's 1e-3; embeddings get 10x)")
    p.add_argument("--smax", type=int, help="staleness guard (default: the paper's 1000, "
                   "scaled to the run length)")
    p.add_argument("--warmup-steps", type=int, help="LayerCheck warm-up (default: the paper's "
                   "200, scaled to the run length)")
    p.add_argument("--config", dest="layercheck", type=_layercheck_config, metavar="JSON",
                   help="a whole LayerCheckConfig as JSON: a file, or the object itself (e.g. "
                   "what `python -m sim tune --json` prints under config); replaces --threshold, "
                   "--smax and --warmup-steps")
    p.add_argument("--device", default=d.device, help="cpu (default) or cuda")
    p.add_argument("--fused-step", action="store_true", help="LayerCheck's fused_step: AdamW's "
                   "step takes the drift sums in the same pass (CPU)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--lora", type=int, metavar="R", help="train a PEFT LoRA adapter of rank R "
                   "(alpha 2R, attention projections) instead of every weight (needs peft)")
    p.add_argument("--out", type=Path, help=out_help)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _layercheck_config(text: str) -> dict:
    """--config: a JSON object, inline or in a file."""
    source = text if text.lstrip().startswith("{") else None
    if source is None:
        try:
            source = Path(text).read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is neither a JSON object nor a readable "
                                             f"file ({exc.strerror})") from None
    try:
        data = json.loads(source)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("give a JSON object of LayerCheckConfig fields, "
                                         'e.g. {"base_threshold": 0.002, "smax": 500}')
    return data


def _config(args: argparse.Namespace) -> CaptureConfig:
    return CaptureConfig(model=args.model, steps=args.steps, batch_size=args.batch_size,
                         seq_len=args.seq_len, lr=args.lr, threshold=args.threshold,
                         smax=args.smax, warmup_steps=args.warmup_steps, device=args.device,
                         seed=args.seed, threads=args.threads, layercheck=args.layercheck,
                         lora=args.lora, fused_step=args.fused_step)


def _run_capture(args: argparse.Namespace, argv: list[str]) -> int:
    if args.deepspeed is not None and args.fsdp:
        raise ProfilerError("--deepspeed and --fsdp are two ways to shard the job: give one")
    if args.deepspeed is not None or args.fsdp:
        return _run_zero_capture(args, argv)
    if args.ranks is not None:
        raise ProfilerError("--ranks applies to a multi-rank capture: add --deepspeed zero3 "
                            "or --fsdp")
    return _capture(_config(args), args, argv)


def _run_zero_capture(args: argparse.Namespace, argv: list[str]) -> int:
    """Outside torchrun: check everything, then start the ranks. Inside: be one."""
    from .launch import launch, world_size
    from .models import resolve_model
    world = world_size()
    if world is not None and args.ranks is not None and args.ranks != world:
        raise ProfilerError(f"--ranks {args.ranks} but torchrun started {world} ranks: drop "
                            f"--ranks, or give torchrun --nproc_per_node {args.ranks}")
    zero = ZeroConfig(capture=_config(args), deepspeed=args.deepspeed or ZeroConfig().deepspeed,
                      fsdp=args.fsdp,
                      ranks=args.ranks if args.ranks is not None else world or ZeroConfig().ranks)
    resolve_model(zero.capture.model)  # a bad --model fails here, before any rank starts
    if world is None:
        return launch(argv, zero)
    return _capture(zero, args, argv)


def _capture(spec: CaptureConfig | ZeroConfig, args: argparse.Namespace, argv: list[str]) -> int:
    from .capture import capture
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = capture(spec, out=args.out, ckpt=args.ckpt, keep_ckpt=args.keep_ckpt,
                     keep_history=args.keep_history, progress=not args.quiet, argv=argv,
                     calibrate=not args.no_calibrate, repeats=args.repeats, say=say)
    if result is not None:  # rank 0
        print(json.dumps({"trace": str(result.path), **result.summary}, indent=2, default=float)
              if args.json else result.text())
    return 0


def _run_drill(args: argparse.Namespace, argv: list[str]) -> int:
    from .failures.drill import drill
    if args.from_trace is None:
        config = DrillConfig(capture=_config(args), failures=args.failures)
    else:
        config = None
    result = drill(config, failures=args.failures, from_trace=args.from_trace, out=args.out,
                   progress=not args.quiet, argv=argv)
    print(f"wrote {result.path}")
    print(json.dumps(result.summary, indent=2, default=float))
    return 0


def _run_staleness(args: argparse.Namespace, argv: list[str]) -> int:
    from .stalecost import RULE, StaleCostConfig, numbers, reread_file, run_staleness
    from .stalefigure import carry_stale_cost, summary_text
    if args.reread is not None:
        doc = reread_file(args.reread, rule=args.rule, argv=argv)
        print(f"wrote {args.reread}")
        print(summary_text(doc))
        return 0
    if args.transfer_to:
        for folder in args.transfer_to:
            figure = carry_stale_cost(folder)
            print(f"{folder}: stale_cost {figure.value:.3f} [{figure.low:.3f}, {figure.high:.3f}] "
                  f"({figure.method.split(' The parts', 1)[0]})")
        return 0
    if args.scratch is not None and not args.scratch.is_dir():
        raise ProfilerError(f"--scratch {args.scratch}: no such folder")
    config = StaleCostConfig(
        capture=_config(args), failures=args.failures, draws=args.draws, parts=args.parts,
        exact=args.exact, thresholds=None if args.thresholds is None else numbers(
            args.thresholds, float, "--thresholds"),
        eval_every=args.eval_every, eval_sequences=args.eval_sequences,
        horizons=numbers(args.horizons, int, "--horizons"), rule=args.rule or RULE,
        resamples=args.resamples, figure_horizon=args.figure_horizon, scratch=args.scratch)
    say = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    path, doc = run_staleness(config, from_trace=args.from_trace, out=args.out, say=say,
                              argv=argv)
    print(f"wrote {path}")
    print(summary_text(doc))
    return 0


def _run_calibrate(args: argparse.Namespace, argv: list[str]) -> int:
    """A ZeRO trace is calibrated under torchrun with its own world size (started here)."""
    from sim.calibrated import read_calibration
    from layercheck.contract.trace import read_trace

    from .calibrate import calibrate_trace, job_spec
    from .launch import launch, world_size
    if args.repeats is not None and args.repeats < 1:
        raise ProfilerError(f"repeats={args.repeats}: use an integer >= 1")
    if args.scratch is not None and not args.scratch.is_dir():
        raise ProfilerError(f"--scratch {args.scratch}: no such folder")
    spec = job_spec(read_trace(args.trace), str(args.trace))
    if isinstance(spec, ZeroConfig) and world_size() is None:
        return launch(argv, spec)
    say = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    path = calibrate_trace(args.trace, repeats=args.repeats, scratch=args.scratch, say=say)
    if path is not None:
        costs = read_calibration(path)
        print(f"wrote {path}")
        for name, figure in costs.figures.items():
            print(f"  {name:22s} {figure.value:12.6g}  {figure.source}")
    return 0


def _run_validate(args: argparse.Namespace, argv: list[str]) -> int:
    from .failures.validate import format_table, validate
    config = _validation_config(args)
    if args.scratch is not None and not args.scratch.is_dir():
        raise ProfilerError(f"--scratch {args.scratch}: no such folder")
    say = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    result = validate(args.trace, config, out=args.out, scratch=args.scratch, say=say, argv=argv)
    print(format_table(result.doc))
    print(f"wrote {result.path}")
    return 0


def _validation_config(args: argparse.Namespace) -> ValidationConfig:
    from sim import SimError, parse_duration, read_failure_log
    try:
        window = parse_duration(args.window, what="--window")
        mtbf = parse_duration(args.mtbf, what="--mtbf")
        failures = read_failure_log(args.failures) if args.failures is not None else None
    except SimError as exc:
        raise ProfilerError(str(exc)) from None
    return ValidationConfig(window_s=window, mtbf_s=mtbf, seed=args.seed, failures_s=failures,
                            interval=args.interval, repeats=args.repeats,
                            min_failures=args.min_failures, probes=args.probes,
                            strategies=tuple(s.strip() for s in args.strategies.split(",")
                                             if s.strip()))


def _run_heatmap(args: argparse.Namespace, argv: list[str]) -> int:
    from layercheck.contract.trace import read_trace

    from .figures import heatmap_png
    trace = read_trace(args.trace)
    png = args.png or Path("docs/img") / f"{trace.name}-drift.png"
    print(f"wrote {heatmap_png(trace, png)}")
    return 0


def _run_worker(args: argparse.Namespace, argv: list[str]) -> int:
    from .failures.worker import run_job
    return run_job(args.job)
