"""A DeepSpeed ZeRO training job with layercheck, for the tests (run under torchrun).

    torchrun --nproc_per_node 2 tests/layercheck/zero_worker.py --dir D --out O --steps 20

Each rank writes ``O/rank<r>.json``: the restored step, per-step losses, and
(``--check``) every mismatch between the restored state and the shards the
restore used. ``--ds-save T`` also saves DeepSpeed's own checkpoint at step
T into ``O/ds``; ``--ds-load`` starts from it instead of layercheck
(``--ds-load-dir P``: from the DeepSpeed checkpoint in P, e.g. an export;
``--check-composite D``: then compare the loaded state with the composite of
layercheck directory D at the loaded step). ``--stop-at T`` ends the job
after step T (the LR schedule still spans ``--steps``); ``--halt-at T`` waits
after step T until its checkpoint is committed, writes ``O/halted<r>`` (the
step) and sleeps until it is killed. ``loaded`` and
``final`` in the report: the engine's counters, LRs and Adam step counts
right after the restore or load, and at the end.
Data depends only on (step, rank), never on the global RNG, so runs that
resume by different routes see the same batches.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402  (before zero.Init)

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.contract.errors import LayerCheckError  # noqa: E402
from layercheck.groups import layer_aligned_param_groups  # noqa: E402
from layercheck.storage.manifest import read_manifest  # noqa: E402
from layercheck.storage.location import open_store  # noqa: E402
from layercheck.zero import ZeroLayerCheck  # noqa: E402
from tests.layercheck.elastic import gathered  # noqa: E402
from tests.layercheck.torchrun import (FROZEN, VOCAB, Report, batch, digest,  # noqa: E402
                                       newest_versions, reference_drift, saved_shards,
                                       schedule, worker_arguments)


def frozen_local(module) -> list:
    """The elements of each frozen parameter this rank holds (ZeRO-3: its partition)."""
    return [getattr(p, "ds_tensor", p).data for n, p in module.named_parameters()
            if n.startswith(FROZEN)]


def build(stage: int, steps: int, misaligned: bool = False, bf16: bool = False,
          reverse_groups: bool = False, round_robin: bool = False, freeze: bool = False):
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                 "gradient_clipping": 1.0, "steps_per_print": 10 ** 9,
                 "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    if round_robin:
        ds_config["zero_optimization"]["round_robin_gradients"] = True
    if bf16:
        ds_config["bf16"] = {"enabled": True}
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = Qwen2ForCausalLM(config)
    else:
        model = Qwen2ForCausalLM(config)
    for name, p in model.named_parameters():
        p.requires_grad_(not (freeze and name.startswith(FROZEN)))
    groups = (model.parameters() if misaligned
              else layer_aligned_param_groups(model, weight_decay=0.01))
    if reverse_groups:
        groups = groups[::-1]
    optimizer = torch.optim.AdamW(groups, lr=3e-3)
    scheduler = schedule(optimizer, steps)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                   lr_scheduler=scheduler, config=ds_config)
    return engine, scheduler


def check_restored(lc: ZeroLayerCheck) -> list[str]:
    """Every mismatch between the live state and the shards of this rank that
    the plan names (master, moments, step, module partition, full module weight)."""
    view = read_manifest(open_store(lc.store.url), lc.ranks.rank)
    for name, version in lc.restored.plan.sources.items():  # the versions the ranks agreed on
        assert version.file == next(v.file for v in view.versions[name] if v.step == version.step)
    return check_composite(lc.source, lc.layer_map, lc.store.url, lc.ranks.rank,
                           lc.restored.plan.sources)


def check_composite(parts, layer_map, url: str, rank: int, sources: dict,
                    adam_step: float | None = None) -> list[str]:
    """Every mismatch between the live state and this rank's shards of the layer
    versions ``sources`` names ({layer: Version}) in layercheck directory ``url``
    (every Adam step count must be ``adam_step`` if given, else the saved one)."""
    problems = []
    for i, name, version, tensors, everyone in saved_shards(url, rank, layer_map.names, sources):
        for k in parts.of_layer[i]:
            flat = parts.flats[k]
            state = parts.optimizer.state[flat]
            pairs = [("master", flat, tensors[f"master/sg{k}"]),
                     ("exp_avg", state["exp_avg"], tensors[f"optim/exp_avg/sg{k}"]),
                     ("exp_avg_sq", state["exp_avg_sq"], tensors[f"optim/exp_avg_sq/sg{k}"]),
                     ("step", state["step"], tensors[f"optim/step/sg{k}"] if adam_step is None
                      else torch.tensor(adam_step, dtype=state["step"].dtype)),
                     ("module partition", parts.low(k), tensors[f"master/sg{k}"].to(parts.low(k).dtype))]
            for what, live, saved in pairs:
                if not torch.equal(live.detach().cpu(), saved):
                    problems.append(f"{name} sg{k} {what} differs from step {version.step}")
            problems += check_full_weights(parts, k, [e[f"master/sg{k}"] for e in everyone], name)
    return problems


def check_full_weights(parts, k: int, masters: list[torch.Tensor], name: str) -> list[str]:
    """Each whole module weight equals its slices of every rank's saved master
    (ZeRO-3: per parameter, gathered; ZeRO-1/2: of the group's flat concatenation)."""
    problems, offset = [], 0
    flat = torch.cat(masters)
    for p in parts.members[k]:
        if parts.stage == 3:
            part = p.ds_tensor.numel()
            full = torch.cat([m[offset:offset + part] for m in masters])[:p.ds_numel].view(p.ds_shape)
            offset += part
            ctx = deepspeed.zero.GatheredParameters([p])
        else:
            full = flat[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
            ctx = _null()
        with ctx:
            if not torch.equal(p.detach().cpu(), full.to(p.dtype)):
                problems.append(f"{name} sg{k}: the module weight differs from the saved masters")
    return problems


def gathered_on(parts, rank: int):
    """The gathered whole tensors (every rank gathers), kept by rank 0."""
    whole = gathered(parts)
    return whole if rank == 0 else None


def loaded_state(engine, scheduler) -> dict:
    """The engine's counters, the learning rates and the Adam step count of every
    flat partition (ZeRO's sub-groups, in order)."""
    ds = engine.optimizer
    flats = (ds.fp32_partitioned_groups_flat if hasattr(ds, "fp32_partitioned_groups_flat")
             else ds.single_partition_of_fp32_groups)
    return {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "skipped_steps": engine.skipped_steps, "lr": scheduler.get_last_lr(),
            "group_lr": [g["lr"] for g in ds.optimizer.param_groups],
            "scheduler": {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"},
            "adam_steps": [float(ds.optimizer.state.get(f, {}).get("step", 0)) for f in flats]}


def full_weights(engine, stage: int) -> dict[str, torch.Tensor]:
    """Copies of the whole (gathered) module weights; a collective under ZeRO-3."""
    out = {}
    for name, p in engine.module.named_parameters():
        ctx = deepspeed.zero.GatheredParameters([p]) if stage == 3 else _null()
        with ctx:
            out[name] = p.detach().clone().double()
    return out


def main() -> int:
    ap = worker_arguments(steps=20)
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--ds-save", type=int, default=0)
    ap.add_argument("--ds-load", action="store_true")
    ap.add_argument("--ds-load-dir", default="")
    ap.add_argument("--expect-adam-step", type=float, default=None,
                    help="with --check-composite: every Adam step count must be this")
    ap.add_argument("--bf16", action="store_true", help="bf16 weights (fp32 masters)")
    ap.add_argument("--sampling", type=int, default=1, help="LayerCheckConfig.drift_sampling")
    ap.add_argument("--fused-step", action="store_true", help="LayerCheckConfig.fused_step")
    ap.add_argument("--sample-min", type=int, default=0,
                    help="sample tensors of this many elements or more (drift.SAMPLE_MIN)")
    ap.add_argument("--misaligned", action="store_true",
                    help="one optimizer group for the whole model (must be refused)")
    ap.add_argument("--reverse-groups", action="store_true",
                    help="the layer-aligned groups in reverse order (must be refused at restore)")
    ap.add_argument("--round-robin", action="store_true",
                    help="ZeRO-1/2's round_robin_gradients (its flat layout is not recorded)")
    ap.add_argument("--dump", action="store_true",
                    help="save the gathered whole tensors of each layer version written "
                         "(O/gathered/<step>.pt) and of the restored state (O/restored<r>.pt)")
    ap.add_argument("--freeze", action="store_true", help=f"freeze {FROZEN}*")
    ap.add_argument("--move-frozen", type=int, default=0,
                    help="from this step on, scale the frozen parameters by 0.99 after each "
                         "step (through .data, as an EMA teacher is moved)")
    ap.add_argument("--scramble-frozen", action="store_true",
                    help="add 1 to the frozen parameters before the restore")
    ap.add_argument("--report-refusal", action="store_true",
                    help="a LayerCheckError from restore() or step() ends the job with exit 0, "
                         "its message in the report (else it is raised)")
    ap.add_argument("--keep-versions", type=int, default=None)
    ap.add_argument("--on-error", default="raise")
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    report = Report(args.out, rank)
    result, out = report.result, report.out
    engine, scheduler = build(args.stage, args.steps, args.misaligned, args.bf16,
                              args.reverse_groups, args.round_robin, args.freeze)
    if args.ds_load or args.ds_load_dir:
        path, _ = engine.load_checkpoint(args.ds_load_dir or str(out / "ds"))
        assert path is not None, "DeepSpeed loaded nothing"
        start = engine.global_steps
        lc = None
        result["loaded"] = loaded_state(engine, scheduler)
        if args.dump:  # the loaded state, whole, and the layer sources of an export's plan
            from layercheck.backends.layermap import LayerMap
            from layercheck.backends.zeropartitions import partitions_for
            plan = json.loads((Path(args.ds_load_dir) / "layercheck_plan.json").read_text())
            result["sources"] = {entry["layer"]: entry["source_step"] for entry in plan["layers"]}
            loaded = gathered(partitions_for(engine, LayerMap.auto(engine.module)))
            loaded["module"] = full_weights(engine, args.stage)
            torch.save(loaded, out / f"restored{rank}.pt")
        if args.check_composite:
            from layercheck.backends.layermap import LayerMap
            from layercheck.backends.zeropartitions import partitions_for
            layer_map = LayerMap.auto(engine.module)
            result["problems"] = check_composite(
                partitions_for(engine, layer_map), layer_map, args.check_composite, rank,
                newest_versions(args.check_composite, start), args.expect_adam_step)
    else:
        config = LayerCheckConfig(base_threshold=args.threshold, embedding_threshold=args.threshold,
                                  smax=args.smax, warmup_steps=2, interval=1,
                                  drift_sampling=args.sampling, keep_versions=args.keep_versions,
                                  on_error=args.on_error, fused_step=args.fused_step)
        if args.sample_min:
            import layercheck.drift.tracker
            layercheck.drift.tracker.SAMPLE_MIN = args.sample_min
        lc = ZeroLayerCheck(engine, args.dir, config, scheduler=scheduler)
        result["sub_groups"] = len(lc.source.flats)
        result["sampled_tensors"] = sum(e.take < e.span for e in lc.drift._all)
        if args.scramble_frozen:
            for t in frozen_local(engine.module):
                t.add_(1)
        try:
            start = lc.restore()
        except LayerCheckError as exc:  # refused: what it said, on every rank
            if not args.report_refusal:
                raise
            return refused(lc, report, exc)
        report.restored(lc, start)
        if start:
            result["layouts"] = sorted({v.layout for v in lc.restored.plan.sources.values()})
        if start and args.dump:  # the restored state, whole, and the weights refreshed from it
            restored = gathered(lc.source)
            restored["module"] = full_weights(engine, args.stage)
            torch.save(restored, out / f"restored{rank}.pt")
        if start:
            result["loaded"] = loaded_state(engine, scheduler)
        if args.check and start:
            result["problems"] = check_restored(lc)
    for step in range(start + 1, (args.stop_at or args.steps) + 1):
        ids = batch(step, rank)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        before = full_weights(engine, args.stage) if args.check_drift else None
        engine.step()
        if before is not None:
            result.setdefault("reference_drift", []).append(reference_drift(lc, before,
                                                                            full_weights(engine, args.stage)))
        if args.ds_save == step:
            engine.save_checkpoint(str(out / "ds"))
        if args.move_frozen and step >= args.move_frozen:
            for t in frozen_local(engine.module):
                t.mul_(0.99)
        try:
            report.step(lc, step, float(loss.detach()), args.halt_at,
                        dump=(lambda: gathered_on(lc.source, rank)) if args.dump else None)
        except LayerCheckError as exc:
            if not args.report_refusal:
                raise
            result["refused_at"] = step
            return refused(lc, report, exc)
    if lc is not None:
        lc.close()
    result["lr"] = scheduler.get_last_lr()[0]
    result["global_steps"] = engine.global_steps
    result["final"] = loaded_state(engine, scheduler)
    result["params"] = {}
    for name, p in engine.module.named_parameters():
        ctx = deepspeed.zero.GatheredParameters([p]) if args.stage == 3 else _null()
        with ctx:
            result["params"][name] = digest(p)
    report.write()
    # a process group alive at exit can abort the process (see ranks.ProcessGroupRanks.close)
    dist.destroy_process_group()
    return 0


def refused(lc, report: Report, exc: Exception) -> int:
    """The job ends where LayerCheck refused: its message in the report, on every rank."""
    report.result["error"] = f"{type(exc).__name__}: {exc}"
    lc.close()
    report.write()
    dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    from profiler.launch import leave
    leave(main())  # the default process group ended, teardown skipped (see launch.leave)
