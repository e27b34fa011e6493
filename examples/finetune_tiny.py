"""A complete training loop with LayerCheck: kill it at any moment, run it again, it resumes.

    python examples/finetune_tiny.py --ckpt runs/tiny-ckpt --steps 200

The model is a small Qwen2 causal LM built from a config; the data is a
fixed, seeded stream of token sequences (each an arithmetic progression
modulo the vocabulary, with its own start and stride), so the loss falls
visibly within a couple of hundred steps on a CPU. It prints where it starts,
a progress line every tenth of the run, and last where the checkpoint is, how
big, and how to inspect it. Each layer keeps its 2 newest versions and its
base copy (``--keep-versions``; 0 keeps every version, which grows the
directory with every write).
"""
from __future__ import annotations

import argparse
import json

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from layercheck import LayerCheck, LayerCheckConfig
from layercheck.tools.inspection import format_size, inspect_directory
from layercheck.storage.location import open_store

VOCAB, SEQ, BATCH = 96, 24, 8


def build_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        tie_word_embeddings=True))


def batch_at(position: int, seed: int) -> torch.Tensor:
    """The batch starting at sample ``position`` of the stream: the data position is
    all a resumed run needs to continue the stream exactly."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + position)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 6, (BATCH, 1), generator=g)
    return (start + stride * torch.arange(SEQ)) % VOCAB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threshold", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--smax", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-versions", type=int, default=2, metavar="K",
                    help="each layer keeps its K newest versions and its base copy (default 2); "
                         "0 keeps every version")
    ap.add_argument("--losses", help="append one JSON line per step here")
    args = ap.parse_args()
    if args.keep_versions < 0:
        ap.error(f"--keep-versions {args.keep_versions}: give at least 1, or 0 to keep every version")
    torch.set_num_threads(1)

    model = build_model(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, 1 - s / args.steps))
    cfg = LayerCheckConfig(base_threshold=args.threshold, embedding_threshold=10 * args.threshold,
                           warmup_steps=args.warmup_steps, smax=args.smax,
                           keep_versions=args.keep_versions or None)
    every = max(1, args.steps // 10)
    with LayerCheck(model, opt, args.ckpt, cfg, scheduler=sched) as lc:
        start = lc.restore()
        say(f"resumed at step {start} of {args.steps}" if start else
            f"training {args.steps} steps, checkpointing into {args.ckpt}")
        position = (lc.extra or {}).get("position", 0)
        log = open(args.losses, "a") if args.losses else None
        for step in range(start + 1, args.steps + 1):
            ids = batch_at(position, args.seed)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            position += BATCH
            lc.step(extra={"position": position})
            if log:
                log.write(json.dumps({"step": step, "loss": float(loss.detach())}) + "\n")
                log.flush()
            if step % every == 0 or step == args.steps:
                say(f"step {step}/{args.steps}  loss {float(loss.detach()):.3f}  "
                    f"persisted {format_size(lc.bytes_written)} so far")
        if log:
            log.close()
    info = inspect_directory(open_store(args.ckpt, create=False), verify=False)
    say(f"checkpoint {args.ckpt}: step {info['newest_step']} recoverable, "
        f"{format_size(info['bytes_on_disk'])} on disk ({info['layer_versions']:,} layer "
        f"versions); inspect it: python -m layercheck inspect {args.ckpt}")


def say(line: str) -> None:
    print(line, flush=True)  # a progress line shows while the run goes on, also into a pipe


if __name__ == "__main__":
    main()
