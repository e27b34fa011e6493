"""The zero_worker's job in one process, without DeepSpeed: the tiny Qwen2 in fp32, torch's
AdamW over the same layer-aligned groups, LayerCheck's ModuleSource.

    python tests/layercheck/plain_worker.py --dir D --out O --steps 24 [--dump]

Each step trains on the batches both ranks of the two-rank job see (the mean of their
losses, clipped at 1.0 as DeepSpeed clips): the same update, in one process.
Its ``restore()`` reads a directory written by ZeRO at any world size (issue 30).
``--dump``: the whole tensors of what it writes and restores (``tests.layercheck.elastic``).
Writes ``O/rank0.json`` as the zero_worker does.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from layercheck import LayerCheck, LayerCheckConfig  # noqa: E402
from layercheck.groups import layer_aligned_param_groups  # noqa: E402
from tests.layercheck.elastic import plain_state  # noqa: E402
from tests.layercheck.torchrun import (FROZEN, VOCAB, Report, batch, digest,  # noqa: E402
                                       schedule, worker_arguments)


def main() -> int:
    ap = worker_arguments(steps=20)
    ap.add_argument("--dump", action="store_true")
    ap.add_argument("--embedding-threshold", type=float, default=None,
                    help="K of the embedding (default: --threshold)")
    ap.add_argument("--freeze", action="store_true", help=f"freeze {FROZEN}* as zero_worker does")
    ap.add_argument("--scramble-frozen", action="store_true",
                    help="add 1 to the frozen parameters before the restore")
    ap.add_argument("--move-frozen", type=int, default=0,
                    help="from this step on, scale the frozen parameters by 0.99 after each step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = Report(args.out, 0)
    result, out = report.result, report.out
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    frozen = [p for name, p in model.named_parameters() if args.freeze and name.startswith(FROZEN)]
    for p in frozen:
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(layer_aligned_param_groups(model, weight_decay=0.01), lr=3e-3)
    scheduler = schedule(optimizer, args.steps)
    lc = LayerCheck(model, optimizer, args.dir, LayerCheckConfig(
        base_threshold=args.threshold, smax=args.smax,
        embedding_threshold=args.threshold if args.embedding_threshold is None
        else args.embedding_threshold,
        warmup_steps=2, interval=1), scheduler=scheduler)

    if args.scramble_frozen:
        with torch.no_grad():
            for p in frozen:
                p.add_(1.0)
    start = lc.restore()
    report.restored(lc, start)
    if start:
        result["layouts"] = sorted({v.layout for v in lc.restored.plan.sources.values()})
        if args.dump:
            torch.save(plain_state(lc), out / "restored0.pt")
    step = start  # where nothing is left to train
    for step in range(start + 1, (args.stop_at or args.steps) + 1):
        losses = [model(input_ids=ids, labels=ids).loss for ids in (batch(step, 0), batch(step, 1))]
        loss = sum(losses) / 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if args.move_frozen and step >= args.move_frozen:
            for p in frozen:
                p.data.mul_(0.99)
        report.step(lc, step, float(losses[0].detach()), args.halt_at,
                    dump=(lambda: plain_state(lc)) if args.dump else None)
    lc.close()
    result["global_steps"] = step
    result["params"] = {name: digest(p) for name, p in model.named_parameters()}
    report.write()
    return 0


if __name__ == "__main__":
    from profiler.launch import leave
    leave(main())  # the default process group ended, teardown skipped (see launch.leave)
