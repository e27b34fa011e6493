"""The zero_worker's job in one process, without DeepSpeed: the tiny Qwen2 in fp32, torch's
AdamW over the same layer-aligned groups, LayerCheck's ModuleSource.

    python tests/layercheck/plain_worker.py --dir D --out O --steps 24 [--elastic-from Z]

Each step trains on the batches both ranks of the two-rank job see (the mean of their
losses, clipped at 1.0 as DeepSpeed clips): the same update, in one process.
``--elastic-from Z`` resumes from a directory written by ZeRO at another world size
(``tests.layercheck.elastic``'s stand-in, ``pieces.zero_layer_tensors`` per layer).
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
from layercheck.pieces import zero_layer_tensors  # noqa: E402
from tests.layercheck.elastic import elastic_restore, plain_state  # noqa: E402
from tests.layercheck.torchrun import VOCAB, Report, batch, schedule, worker_arguments  # noqa: E402


def main() -> int:
    ap = worker_arguments(steps=20)
    ap.add_argument("--elastic-from", default="")
    ap.add_argument("--dump", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = Report(args.out, 0)
    result, out = report.result, report.out
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(layer_aligned_param_groups(model, weight_decay=0.01), lr=3e-3)
    scheduler = schedule(optimizer, args.steps)
    lc = LayerCheck(model, optimizer, args.dir, LayerCheckConfig(
        base_threshold=args.threshold, embedding_threshold=args.threshold, smax=args.smax,
        warmup_steps=2, interval=1), scheduler=scheduler)

    def apply_layer(i, written, read):
        tensors = zero_layer_tensors(written, lc.layer_map.names[i], lc.layer_map.parameters(i),
                                     lc.layer_map.buffers(i), read, optimizer)
        lc.source.check(i, tensors)
        lc.source.apply(i, tensors)
    if args.elastic_from:
        start, result["sources"] = elastic_restore(lc, args.elastic_from, 0, apply_layer)
        result["restored_step"] = start
        torch.save(plain_state(lc), out / "restored0.pt")
        report.write()  # what was restored, should the job be killed later
    else:
        start = lc.restore()
        report.restored(lc, start)
    for step in range(start + 1, (args.stop_at or args.steps) + 1):
        losses = [model(input_ids=ids, labels=ids).loss for ids in (batch(step, 0), batch(step, 1))]
        loss = sum(losses) / 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        report.step(lc, step, float(losses[0].detach()), args.halt_at,
                    dump=(lambda: plain_state(lc)) if args.dump else None)
    lc.close()
    result["global_steps"] = step
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
