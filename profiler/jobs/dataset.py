"""Token blocks cut from the corpus, and the batch at any data position.

The batch at position p (samples consumed so far) is a pure function of
(seed, p): the sample order is a seeded permutation per epoch and the masks
of a masked-LM batch come from a generator seeded by (seed, p). A run that
restarts from a checkpoint with the data position of step t therefore sees
exactly the batches the failure-free run saw: the only difference left is
the restored model.

Masked LM (encoders, BERT recipe): 15% of the non-special tokens are chosen;
80% of those become [MASK], 10% a random token, 10% stay; the loss is on
the chosen ones. Causal LM (decoders): next-token loss on every token.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .corpus import Corpus
from ..errors import ProfilerError

__all__ = ["Dataset", "MASK_PROB"]

MASK_PROB = 0.15
EVAL_SEED = 1_000_003
"""Held-out masks use this seed whatever the run's seed: one fixed yardstick."""


@dataclass(kw_only=True)
class Dataset:
    """Training and held-out blocks of ``seq_len`` tokens, and how to batch them."""

    train: torch.Tensor
    heldout: torch.Tensor
    objective: str
    batch_size: int
    seed: int
    mask_id: int | None = None
    vocab_size: int = 256
    special_ids: Sequence[int] = ()
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, corpus: Corpus, tokenizer: Any, *, objective: str, seq_len: int,
              batch_size: int, seed: int) -> "Dataset":
        """Tokenize ``corpus`` (bytes when ``tokenizer`` is None) into blocks."""
        make = _masked_blocks if objective == "masked" else _causal_blocks
        train, heldout = (make(docs, tokenizer, seq_len) for docs in (corpus.train, corpus.heldout))
        if len(train) < batch_size or len(heldout) == 0:
            raise ProfilerError(f"the corpus gives {len(train)} training blocks of {seq_len} "
                                f"tokens, fewer than --batch-size {batch_size}: lower one of them")
        extra: dict[str, Any] = {}
        if tokenizer is not None:
            extra = {"mask_id": tokenizer.mask_token_id, "vocab_size": len(tokenizer),
                     "special_ids": sorted(set(tokenizer.all_special_ids))}
        return cls(train=train, heldout=heldout, objective=objective, batch_size=batch_size,
                   seed=seed, **extra)

    def describe(self) -> dict[str, Any]:
        return {"objective": self.objective, "train_blocks": len(self.train),
                "heldout_blocks": len(self.heldout), "seq_len": self.train.shape[1],
                "tokens_per_step": self.batch_size * self.train.shape[1],
                "mask_prob": MASK_PROB if self.objective == "masked" else None}

    # -- batches -------------------------------------------------------------
    def batch_at(self, position: int) -> dict[str, torch.Tensor]:
        """The training batch of samples ``position .. position + batch_size - 1``."""
        n = len(self.train)
        rows = [self._order(i // n)[i % n] for i in range(position, position + self.batch_size)]
        ids = self.train[torch.as_tensor(np.asarray(rows))]
        return self._inputs(ids, seed=self.seed * 7_919 + position)

    def heldout_batches(self, limit: int) -> Iterator[dict[str, torch.Tensor]]:
        """The first ``limit`` held-out blocks, in batches, with fixed masks."""
        blocks = self.heldout[:limit]
        for start in range(0, len(blocks), self.batch_size):
            yield self._inputs(blocks[start:start + self.batch_size], seed=EVAL_SEED + start)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.train))}
        return self._orders[epoch]

    def _inputs(self, ids: torch.Tensor, *, seed: int) -> dict[str, torch.Tensor]:
        if self.objective == "causal":
            return {"input_ids": ids, "labels": ids.clone()}
        return self._mask(ids, torch.Generator().manual_seed(seed))

    def _mask(self, ids: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        special = torch.isin(ids, torch.as_tensor(list(self.special_ids), dtype=ids.dtype))
        chosen = (torch.rand(ids.shape, generator=g) < MASK_PROB) & ~special
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        action = torch.rand(ids.shape, generator=g)
        random_ids = torch.randint(0, self.vocab_size, ids.shape, generator=g)
        inputs = torch.where(chosen & (action < 0.8), torch.full_like(ids, self.mask_id), ids)
        inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, inputs)
        return {"input_ids": inputs, "labels": labels}


def _masked_blocks(docs: Sequence[str], tokenizer: Any, seq_len: int) -> torch.Tensor:
    """[CLS] + seq_len-2 tokens of the document stream + [SEP] per block."""
    stream = _token_stream(docs, tokenizer, tokenizer.sep_token_id)
    body = seq_len - 2
    n = len(stream) // body
    blocks = torch.as_tensor(stream[:n * body], dtype=torch.int64).view(n, body)
    cls_col = torch.full((n, 1), tokenizer.cls_token_id, dtype=torch.int64)
    sep_col = torch.full((n, 1), tokenizer.sep_token_id, dtype=torch.int64)
    return torch.cat([cls_col, blocks, sep_col], dim=1)


def _causal_blocks(docs: Sequence[str], tokenizer: Any, seq_len: int) -> torch.Tensor:
    if tokenizer is None:
        stream = np.frombuffer("\n\n".join(docs).encode("utf-8"), dtype=np.uint8).astype(np.int64)
    else:
        stream = _token_stream(docs, tokenizer, tokenizer.eos_token_id)
    n = len(stream) // seq_len
    return torch.as_tensor(np.asarray(stream[:n * seq_len]), dtype=torch.int64).view(n, seq_len)


def _token_stream(docs: Sequence[str], tokenizer: Any, separator: int | None) -> np.ndarray:
    encoded = tokenizer(list(docs), add_special_tokens=False, verbose=False)["input_ids"]
    out: list[int] = []
    for ids in encoded:
        out.extend(ids)
        if separator is not None:
            out.append(separator)
    return np.asarray(out, dtype=np.int64)
