"""A small training job with the memory tier (and a buddy, under torchrun): the tiers tests' worker.

    python tests/layercheck/tiers_worker.py --dir D --tier T --out O --steps 12 [--halt-at 7]

An MLP with dropout (the RNG matters) trained by AdamW under a schedule, on
batches that depend on the step and rank only. After the restore and after
every step it records a digest of the whole training state (parameters,
optimizer state, scheduler, RNG) in ``O/rank<r>.json``, with the restored step
and where each layer came from. ``--halt-at T``: once step T is committed in
every tier, write ``O/halted<r>`` and sleep (the test kills it).
Fault-injection points (each SIGKILLs this process at a point of the protocol,
by wrapping the library function that reaches it; nothing else changes):
``--die-in-write T``: halfway through writing step T's memory-tier slot.
``--die-in-send R:T``: on rank R, in the buddy exchange of step T, once the first
item's send has completed (the buddy is then receiving into its ward slot),
before the next item is sent. ``--die-in-receive R:T``: on rank R, in the buddy
exchange of step T, once the first item of its ward's copy has arrived, before
the ward slot is committed. ``--die-in-move R``: on rank R, in the restore's
buddy transfer, once it has sent or received its first item.

Under torchrun (``--dist``), ranks average their gradients over gloo and the
node is ``$GROUP_RANK`` (each torchrun is a node).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tiers import TierConfig


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> str:
    """sha256 of every parameter, optimizer tensor, the schedule's step and the RNG."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode() + p.detach().contiguous().view(torch.uint8).numpy().tobytes())
        for field, value in sorted(optimizer.state.get(p, {}).items()):
            value = value if torch.is_tensor(value) else torch.tensor(float(value))
            h.update(field.encode() + value.detach().contiguous().reshape(-1)
                     .view(torch.uint8).numpy().tobytes())
    h.update(json.dumps(scheduler.state_dict(), default=str, sort_keys=True).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tier", required=True, help="the memory tier's folder (this node's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--halt-at", type=int, default=0)
    ap.add_argument("--die-in-write", type=int, default=0)
    ap.add_argument("--die-in-send", metavar="RANK:STEP")
    ap.add_argument("--die-in-receive", metavar="RANK:STEP")
    ap.add_argument("--die-in-move", type=int, metavar="RANK")
    ap.add_argument("--dist", action="store_true")
    ap.add_argument("--width", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank = 0
    if args.dist:
        import torch.distributed as dist
        from layercheck.backends.ranks import ProcessGroupRanks
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(8, w), nn.ReLU(), nn.Dropout(0.1), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    config = LayerCheckConfig(base_threshold=10.0, embedding_threshold=10.0, smax=4,
                              warmup_steps=2)
    tiers = TierConfig(folder=args.tier, budget_bytes=64 << 20,
                       node=f"node{os.environ.get('GROUP_RANK', '0')}")
    lc = LayerCheck(model, optimizer, args.dir, config, scheduler=scheduler, tiers=tiers,
                    ranks=ProcessGroupRanks() if args.dist else None)
    if args.die_in_write:
        die_in_write(args.die_in_write)
    for where, kind in ((args.die_in_send, "send"), (args.die_in_receive, "receive")):
        if where is not None and int(where.split(":")[0]) == rank:
            die_in_exchange(kind, int(where.split(":")[1]))
    if args.die_in_move is not None and args.die_in_move == rank:
        die_in_move()
    result: dict = {"rank": rank, "digests": {}}
    start = lc.restore()
    result["restored_step"] = start
    result["restored_digest"] = state_digest(model, optimizer, scheduler)
    if lc.tiers.last is not None:
        result["sources"] = lc.tiers.last.sources
    result["extra"] = lc.extra
    tmp = out / f".restored{rank}.json.tmp"  # what a drill that kills this run reads
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out / f"restored{rank}.json")
    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 8, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        if args.dist:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        lc.step(extra={"step": step})
        result["digests"][step] = state_digest(model, optimizer, scheduler)
        if step == args.halt_at:
            lc.flush()
            (out / f"rank{rank}.json").write_text(json.dumps(result))
            (out / f"halted{rank}").write_text(str(step))
            while True:
                time.sleep(3600)
    lc.close()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    return 0


def die_in_write(step: int) -> None:
    """SIGKILL this process once two of step ``step``'s memory-tier items are written."""
    from layercheck.tiers.memory import MemoryTier
    from layercheck.tiers.slots import Slot
    now = {"step": 0, "items": 0}
    tier_write, slot_write = MemoryTier.write, Slot.write

    def tier(self, t, *args, **kwargs):
        now["step"], now["items"] = t, 0
        return tier_write(self, t, *args, **kwargs)

    def slot(self, name, tensors):
        done = slot_write(self, name, tensors)
        now["items"] += 1
        if now["step"] == step and now["items"] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return done
    MemoryTier.write, Slot.write = tier, slot


def die_in_exchange(kind: str, step: int) -> None:
    """SIGKILL this process in the buddy exchange of step ``step``: once its first item
    is sent, before the next (``send``: a gloo send completes only once the peer has
    posted its receive, so the buddy has invalidated its ward slot and is receiving
    into it), or once its ward's first item has arrived (``receive``: the ward slot
    holds bytes of step ``step`` and no marker)."""
    import torch.distributed as dist
    from layercheck.tiers.buddy import BuddyLink
    FIRST_ITEM = 3  # BuddyLink.exchange's tags: 1 the header, 2 the marker, 3... the items
    now = {"step": 0}
    exchange, isend, irecv = BuddyLink.exchange, dist.isend, dist.irecv

    def exchange_of(self, slot, record):
        now["step"] = record["step"]
        return exchange(self, slot, record)

    def sending(tensor, dst, group=None, tag=0):
        if kind == "send" and now["step"] == step and tag == FIRST_ITEM + 1:
            now["first"].wait()
            os.kill(os.getpid(), signal.SIGKILL)
        work = isend(tensor, dst, group=group, tag=tag)
        now["first"] = work if tag == FIRST_ITEM else now.get("first")
        return work

    class Dying:
        def __init__(self, work):
            self.work = work

        def wait(self):
            self.work.wait()
            os.kill(os.getpid(), signal.SIGKILL)

    def receiving(tensor, src, group=None, tag=0):
        work = irecv(tensor, src, group=group, tag=tag)
        dies = kind == "receive" and now["step"] == step and tag == FIRST_ITEM
        return Dying(work) if dies else work
    BuddyLink.exchange, dist.isend, dist.irecv = exchange_of, sending, receiving


def die_in_move() -> None:
    """SIGKILL this process in a restore's buddy transfer, once its first item is sent
    or received (``BuddyLink.move``: blocking sends and receives)."""
    import torch.distributed as dist
    send, recv = dist.send, dist.recv

    def sending(*args, **kwargs):
        send(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    def receiving(*args, **kwargs):
        recv(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.send, dist.recv = sending, receiving


if __name__ == "__main__":
    sys.exit(main())
