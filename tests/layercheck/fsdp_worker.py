"""An FSDP2 training job with layercheck, for the tests (run under torchrun, gloo, CPU).

    torchrun --nproc_per_node 2 tests/layercheck/fsdp_worker.py --dir D --out O --steps 12

A tiny Qwen2 causal LM (tied embedding), ``fully_shard`` per block then the
root on a 1-D CPU mesh, AdamW with two groups (decay, no decay), a LambdaLR
schedule. Each rank writes ``O/rank<r>.json``: the restored step, per-step
losses, drift and written layers, a hash of every whole parameter at the end,
and (``--check``) every mismatch between the restored state and the shards
the restore used. ``--restore-step T`` restores exactly step T.
``--halt-at T`` waits after step T until its checkpoint is committed, writes
``O/halted<r>`` and sleeps until killed. ``--stop-at T`` ends after step T
(the LR schedule still spans ``--steps``). ``--check-drift`` records the
drift of each whole layer from gathered weight copies beside the measured
one. ``--dcp-load P`` starts from the DCP checkpoint in P (an export) instead
of layercheck; ``--check-composite D`` then compares the loaded state with
the composite of layercheck directory D at the loaded step. ``--save-final F``
writes the whole parameters at the end to F (safetensors, rank 0).
``--refusals`` (one rank, on a directory two ranks wrote) records what
FsdpLayerCheck refuses: an unsharded model, the optimizer made first.
Elastic (issue 30): ``--plain`` trains the unsharded model in one process under
a plain ``LayerCheck``; ``--data-ranks D`` keeps the global batch of D ranks
at any world size (each process takes the micro-batches of ranks r, r+W, ...,
the loss scaled by W/D, so the gradient is the D-rank mean) and records the
global loss of each step; ``--check-elastic`` compares the restored state with
the composite's whole tensors (every layout joined offline); ``--learnable``
trains on sequences that step through the vocabulary (``learnable_batch``),
whose loss falls, where the default random tokens stay at chance.
Data depends only on (step, rank), never on the global RNG, so runs that
resume by different routes see the same batches.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.backends.source import local  # noqa: E402
from layercheck.contract.errors import LayerCheckError  # noqa: E402
from layercheck.fsdp import FsdpLayerCheck  # noqa: E402
from tests.conftest import tiny_lm  # noqa: E402
from tests.layercheck.torchrun import (VOCAB, Report, batch, digest, newest_versions,  # noqa: E402
                                       reference_drift, saved_shards, schedule,
                                       worker_arguments)


def build(steps: int, *, shard: bool = True, lr: float = 3e-3, freeze: tuple[str, ...] = ()):
    """The model (sharded unless ``shard`` is False; the parameters whose names start
    with one of ``freeze`` frozen, outside the optimizer), AdamW at peak ``lr`` and the
    LR schedule."""
    model = tiny_lm(tied=True, layers=3, seed=0)
    for name, p in model.named_parameters():
        if name.startswith(tuple(freeze)):
            p.requires_grad_(False)
    if shard:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    plain = [p for p in trained if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": plain, "weight_decay": 0.0}], lr=lr)
    return model, optimizer, schedule(optimizer, steps)


def check_composite(model, optimizer, layer_map, url: str, sources: dict) -> list[str]:
    """Every mismatch between the live state of this rank and its shards of the
    layer versions ``sources`` names ({layer: Version}) in directory ``url``:
    each parameter's local tensor, its Adam moments (DTensors placed as the
    parameter) and step count, and the whole parameter against every rank's
    saved slices (a collective)."""
    problems = []
    for i, _, version, mine, everyone in saved_shards(url, dist.get_rank(), layer_map.names,
                                                      sources):
        for pname, p in layer_map.parameters(i):
            state = optimizer.state[p]
            pairs = [("weight", local(p), mine[f"param/{pname}"]),
                     ("step", state["step"], mine[f"optim/step/{pname}"])]
            for field in ("exp_avg", "exp_avg_sq"):
                pairs.append((field, local(state[field]), mine[f"optim/{field}/{pname}"]))
                if state[field].placements != p.placements:
                    problems.append(f"{pname} {field} is placed {state[field].placements}")
            for what, live, saved in pairs:
                if not torch.equal(live.detach().cpu(), saved):
                    problems.append(f"{pname} {what} differs from step {version.step}")
            whole = torch.cat([e[f"param/{pname}"] for e in everyone])
            if not torch.equal(p.full_tensor().detach(), whole):
                problems.append(f"{pname}: the whole weight differs from the saved shards")
    return problems


def learnable_batch(step: int, rank: int) -> torch.Tensor:
    """As ``batch``, but each sequence steps through the vocabulary by a stride of 1 to
    3 from a random start: the next token is predictable, so the loss falls."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, VOCAB, (2, 1), generator=g)
    stride = torch.randint(1, 4, (2, 1), generator=g)
    return (start + stride * torch.arange(16)) % VOCAB


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_weights(model) -> dict[str, torch.Tensor]:
    """Whole copies of every parameter (a collective)."""
    return {n: whole(p).detach().clone().double() for n, p in model.named_parameters()}


def check_elastic(optimizer, layer_map, url: str, step: int) -> list[str]:
    """Every mismatch between this rank's live state and its rows of the composite of
    ``step`` as whole tensors (``assemble``, each version joined by its own layout):
    each parameter's local tensor, its Adam moments and step count, bit for bit."""
    from layercheck.tools.dcpcheckpoint import assemble
    from layercheck.backends.elastic import chunk_rows
    from layercheck.storage.manifest import read_manifest
    from layercheck.recovery import make_plan
    from layercheck.storage.location import open_store
    store = open_store(url)
    view = read_manifest(store)
    composite = assemble(store, view, make_plan(store, view, step, exact=True), None)
    problems = []
    world, rank = dist.get_world_size(), dist.get_rank()
    for i in range(len(layer_map)):
        for name, p in layer_map.parameters(i):
            sharded = hasattr(p, "to_local")
            def mine(t):  # noqa: E306 - this rank's rows of a whole tensor
                if not sharded or t.dim() == 0:
                    return t
                start, stop = chunk_rows(t.shape[0], world)[rank]
                return t[start:stop]
            state = optimizer.state.get(p, {})
            pairs = [("weight", local(p), mine(composite.weights[name]))]
            if not p.requires_grad:  # frozen: no optimizer state, saved or live
                if state or composite.optimizer.get(name):
                    problems.append(f"{name} is frozen but has optimizer state")
            else:
                pairs += [(f, local(state[f]) if f != "step" else state[f],
                           mine(composite.optimizer[name][f]))
                          for f in ("exp_avg", "exp_avg_sq", "step")]
            for what, live, saved in pairs:
                if not torch.equal(live.detach().cpu(), saved):
                    problems.append(f"{name} {what} differs from the composite of step {step}")
            if sharded and state and state["exp_avg"].placements != p.placements:
                problems.append(f"{name} exp_avg is placed {state['exp_avg'].placements}")
    return problems


def dcp_load(model, optimizer, scheduler, path: str) -> int:
    """The README's recipe: load an exported DCP checkpoint into a fresh FSDP2
    model, optimizer and scheduler; returns the exported step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": scheduler.state_dict(),
             "layercheck": {"step": 0}}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["layercheck"]["step"])


def refusals(args: argparse.Namespace) -> dict:
    """What FsdpLayerCheck refuses, each with its message; under ``groups_left`` how
    many process groups each refused constructor left open (it makes two of its own).
    Another world size is no longer refused (issue 30: it reshards on restore)."""
    out: dict = {"groups_left": {}}
    for name, shard, directory in (("unsharded", False, args.dir + "-unsharded"),
                                   ("optimizer_first", True, args.dir + "-optimizer-first")):
        model, optimizer, scheduler = build(args.steps, shard=shard)
        if name == "optimizer_first":  # an optimizer over the parameters before fully_shard
            model = tiny_lm(tied=True, layers=3, seed=0)
            optimizer = torch.optim.AdamW(model.parameters())
            fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        groups = len(dist.distributed_c10d._world.pg_map)
        try:
            FsdpLayerCheck(model, optimizer, directory, LayerCheckConfig(), scheduler=scheduler)
            out[name] = None
        except LayerCheckError as exc:
            out[name] = str(exc)
        out["groups_left"][name] = len(dist.distributed_c10d._world.pg_map) - groups
    return out


def main() -> int:
    ap = worker_arguments(steps=12)
    ap.add_argument("--restore-step", type=int, default=None)
    ap.add_argument("--dcp-load", default="")
    ap.add_argument("--save-final", default="")
    ap.add_argument("--refusals", action="store_true")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--data-ranks", type=int, default=0)
    ap.add_argument("--check-elastic", action="store_true")
    ap.add_argument("--learnable", action="store_true")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--scramble-frozen", action="store_true",
                    help="add 1 to the frozen parameters before the restore")
    ap.add_argument("--move-frozen", type=int, default=0,
                    help="from this step on, scale the frozen parameters by 0.99 after each "
                         "step (each rank its shard, through .data, as an EMA teacher moves)")
    ap.add_argument("--freeze", action="append", default=[],
                    help="freeze the parameters whose names start with this (repeatable)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    report = Report(args.out, rank)
    result = report.result
    if args.refusals:
        result["refusals"] = refusals(args)
        report.write()
        dist.destroy_process_group()
        return 0
    model, optimizer, scheduler = build(args.steps, shard=not args.plain, lr=args.lr,
                                       freeze=tuple(args.freeze))
    lc = None
    if args.dcp_load:
        start = dcp_load(model, optimizer, scheduler, args.dcp_load)
        result["loaded_step"] = start
        if args.check_composite:
            from layercheck.backends.layermap import LayerMap
            result["problems"] = check_composite(model, optimizer, LayerMap.auto(model),
                                                 args.check_composite,
                                                 newest_versions(args.check_composite, start))
    else:
        config = LayerCheckConfig(base_threshold=args.threshold, embedding_threshold=args.threshold,
                                  smax=args.smax, warmup_steps=2, interval=1)
        if args.plain:
            from layercheck import LayerCheck
            lc = LayerCheck(model, optimizer, args.dir, config, scheduler=scheduler)
        else:
            lc = FsdpLayerCheck(model, optimizer, args.dir, config, scheduler=scheduler)
            result["units"] = lc.source.header_facts()["fsdp"]["units"]
        if args.scramble_frozen:  # only the restore can give the frozen weights back
            with torch.no_grad():
                for p in model.parameters():
                    if not p.requires_grad:
                        p.add_(1.0)
        start = lc.restore(args.restore_step, exact=args.restore_step is not None)
        report.restored(lc, start)
        if args.check and start:
            result["problems"] = check_composite(model, optimizer, lc.layer_map, args.dir,
                                                 lc.restored.plan.sources)
        if args.check_elastic and start:
            result["problems"] = check_elastic(optimizer, lc.layer_map, args.dir, start)
            result["layouts"] = sorted({v.layout for v in lc.restored.plan.sources.values()})
    result["lr_at_start"] = scheduler.get_last_lr()
    for step in range(start + 1, (args.stop_at or args.steps) + 1):
        if args.data_ranks:  # the global batch of --data-ranks ranks, at any world size
            world = dist.get_world_size()
            total = torch.zeros((), dtype=torch.float64)
            for data_rank in range(rank, args.data_ranks, world):
                ids = (learnable_batch if args.learnable else batch)(step, data_rank)
                micro = model(input_ids=ids, labels=ids).loss
                (micro * world / args.data_ranks).backward()
                total += float(micro.detach())
            dist.all_reduce(total)
            result.setdefault("global_losses", {})[step] = float(total) / args.data_ranks
            loss = micro
        else:
            ids = batch(step, rank)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        before = full_weights(model) if args.check_drift else None
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if args.move_frozen and step >= args.move_frozen:
            for p in model.parameters():
                if not p.requires_grad:
                    local(p).data.mul_(0.99)
        if before is not None:
            result.setdefault("reference_drift", []).append(
                reference_drift(lc, before, full_weights(model)))
        report.step(lc, step, float(loss.detach()), args.halt_at)
    if lc is not None:
        lc.close()
    result["lr"] = scheduler.get_last_lr()[0]
    weights = {n: whole(p).detach().contiguous() for n, p in model.named_parameters()}
    result["params"] = {n: digest(t) for n, t in weights.items()}
    if args.save_final and rank == 0:
        from safetensors.torch import save_file
        save_file(weights, args.save_final)
    report.write()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from profiler.launch import leave
    leave(main())  # the default process group ended, teardown skipped (see launch.leave)
