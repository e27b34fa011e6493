"""A sharded job (FSDP2 or ZeRO) with the memory tier and a buddy: test_tiers_shards's worker.

    torchrun --standalone --nproc_per_node 2 tests/layercheck/tiers_shards_worker.py \
        --backend fsdp --dir D --tier T --out O --steps 6 [--halt-at 4] [--one-node]

The tiny Qwen2 of ``fsdp_worker.py`` (``--backend fsdp``) or ``zero_worker.py``
(``--backend zero2``, ``zero3``), trained on batches that depend on the step and
rank only, under ``FsdpLayerCheck`` / ``ZeroLayerCheck`` with
``tiers=TierConfig(...)``. Each rank is a node of its own (``node<rank>``,
memory tier ``T/node<rank>``, its buddy the other rank), or with ``--one-node``
every rank is on ``node0`` (``T/node0``, no buddy). After the restore and after
every step a rank records in ``O/rank<r>.json`` a digest of the shard it owns
(parameters or fp32 masters, their optimizer state, module partitions), the
scheduler and the RNG (``digests``), and of the whole model and its moments
gathered (``whole``: FSDP2's DTensors, ZeRO's flat partitions all-gathered and cut
per parameter, with the module weights; comparable across world sizes), with the
restored step and where each layer came from. ``--halt-at T``: once step T is
committed in every tier, write ``O/halted<r>`` and sleep (the test kills it).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.backends.source import local  # noqa: E402
from layercheck.tiers import TierConfig  # noqa: E402
from tests.layercheck.torchrun import batch, worker_arguments  # noqa: E402


def hashed(h, name: str, t) -> None:
    t = t if torch.is_tensor(t) else torch.tensor(float(t))
    h.update(name.encode() + local(t).detach().contiguous().reshape(-1).view(torch.uint8)
             .numpy().tobytes())


def shard_digest(lc, scheduler) -> str:
    """sha256 of what this rank owns (see the module doc), the schedule and the RNG."""
    h = hashlib.sha256()
    source = lc.source
    if hasattr(source, "flats"):  # ZeRO: fp32 masters, their Adam state, module partitions
        for k, flat in enumerate(source.flats):
            hashed(h, f"master{k}", flat)
            hashed(h, f"low{k}", source.low(k))
            for field, value in sorted(source.optimizer.state.get(flat, {}).items()):
                hashed(h, f"{field}{k}", value)
        h.update(str(lc.model.training).encode())
    else:
        for name, p in lc.model.named_parameters():
            hashed(h, name, p)
            for field, value in sorted(lc.optimizer.state.get(p, {}).items()):
                hashed(h, f"{field}/{name}", value)
    h.update(json.dumps(scheduler.state_dict(), default=str, sort_keys=True).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()


def whole_digest(model, optimizer) -> str:
    """sha256 of every whole parameter and moment (FSDP2: gathered, a collective)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode() + p.full_tensor().detach().reshape(-1).view(torch.uint8)
                 .numpy().tobytes())
        for field, value in sorted(optimizer.state.get(p, {}).items()):
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            hashed(h, f"{field}/{name}", value)
    return h.hexdigest()


def zero_whole_digest(lc, stage: int, scheduler) -> str:
    """sha256 of every parameter's whole fp32 master, Adam moments and step count
    (all-gathered from every rank's flat partitions: ``tests.layercheck.elastic``), the
    nonzero padding, the whole module weights and the schedule: comparable across world
    sizes. A collective."""
    from tests.layercheck.elastic import gathered
    from tests.layercheck.zero_worker import full_weights
    h = hashlib.sha256()
    whole = gathered(lc.source)
    h.update(str(whole.pop("padding")).encode())
    for name in sorted(whole):
        for what in ("master", "exp_avg", "exp_avg_sq", "step"):
            hashed(h, f"{what}/{name}", whole[name][what])
    for name, weight in sorted(full_weights(lc.source.engine, stage).items()):
        hashed(h, name, weight)
    h.update(json.dumps({k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"},
                        default=str, sort_keys=True).encode())
    return h.hexdigest()


def main() -> int:
    ap = worker_arguments(6)
    ap.add_argument("--backend", choices=("fsdp", "zero2", "zero3"), default="fsdp")
    ap.add_argument("--tier", required=True, help="the memory tiers' root (a folder per node)")
    ap.add_argument("--one-node", action="store_true", help="every rank on node0, no buddy")
    ap.set_defaults(smax=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    said = logging.getLogger("layercheck")  # what a restore says, in the output
    said.setLevel(logging.INFO)
    said.addHandler(logging.StreamHandler())
    config = LayerCheckConfig(base_threshold=10.0, embedding_threshold=10.0, smax=args.smax,
                              warmup_steps=2)
    if args.backend == "fsdp":
        dist.init_process_group("gloo")
    else:
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = "node0" if args.one_node else f"node{rank}"
    tiers = TierConfig(folder=str(Path(args.tier) / node), node=node, budget_bytes=64 << 20,
                       buddy=not args.one_node, timeout_s=120)
    if args.backend == "fsdp":
        from layercheck.fsdp import FsdpLayerCheck
        from tests.layercheck.fsdp_worker import build
        model, optimizer, scheduler = build(args.steps)
        lc = FsdpLayerCheck(model, optimizer, args.dir, config, scheduler=scheduler,
                            tiers=tiers)

        def train(ids):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    else:
        from layercheck.zero import ZeroLayerCheck
        from tests.layercheck.zero_worker import build
        engine, scheduler = build(int(args.backend[-1]), args.steps)
        lc = ZeroLayerCheck(engine, args.dir, config, tiers=tiers)

        def train(ids):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def record(step: int) -> None:
        result["digests"][step] = shard_digest(lc, scheduler)
        if args.backend == "fsdp":
            result["whole"][step] = whole_digest(lc.model, lc.optimizer)
        elif step > 0:  # ZeRO's Adam state exists once a step has run
            result["whole"][step] = zero_whole_digest(lc, int(args.backend[-1]), scheduler)

    result: dict = {"rank": rank, "world": world, "digests": {}, "whole": {}}
    start = lc.restore()
    result["restored_step"] = start
    record(start)
    if lc.tiers.last is not None:
        result["sources"] = lc.tiers.last.sources
    for step in range(start + 1, args.steps + 1):
        train(batch(step, rank))
        lc.step(extra={"step": step})
        record(step)
        if step == args.halt_at:
            lc.flush()
            (out / f"rank{rank}.json").write_text(json.dumps(result))
            (out / f"halted{rank}").write_text(str(step))
            while True:
                time.sleep(3600)
    lc.close()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
