"""The job protocol: what a capture, a calibration or a worker asks of a training job.

One base class, three implementations: ``PlainJob`` (one process, the
model and AdamW as they are; ``profiler.jobs.plain``), ``ZeroJob`` (the same
job inside a DeepSpeed ZeRO-3 engine, one process per rank;
``profiler.jobs.zero``) and ``FsdpJob`` (the same job under PyTorch FSDP2,
``profiler.jobs.fsdp``). ``profiler.jobs.open_job`` builds the one a config asks for.

Contract (every rank calls the same sequence; under ZeRO each forward is a
collective): ``step(position)`` trains one optimizer step on the batch at
data ``position`` and returns this rank's share of the batch's mean loss (the
shares of all ranks sum to it) and the phase times; ``evaluate()`` gives the
held-out loss (the same number on every rank); ``make_layercheck(directory,
config)`` attaches the LayerCheck of this kind of job; ``ranks`` does what
ranks must agree on (nothing at world size 1); ``manifest_parts`` is what a
trace says about the setup.

What every job shares is here: the model and data built from the config,
AdamW on layer-aligned parameter groups (``layercheck.groups``: matrices
decay, biases and norm weights do not), the LR schedule (linear warm-up over
``lr_warmup_fraction`` of the steps, linear decay to zero at the end).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from layercheck.backends.ranks import Ranks

from ..config import CaptureConfig
from .corpus import Corpus, load_corpus
from .dataset import Dataset
from ..models import ModelSource, resolve_model

__all__ = ["Job", "PhaseTimes", "adamw", "lr_schedule", "predicted_tokens"]


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of one step's phases; ``optimizer_s`` includes the LR
    scheduler and zeroing gradients, and still includes any drift hook that
    ran inside the optimizer step (the caller subtracts it)."""

    forward_s: float
    backward_s: float
    optimizer_s: float

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


class Job:
    """A training job: model, data, optimizer, schedule (see the module contract)."""

    config: CaptureConfig
    source: ModelSource
    corpus: Corpus
    dataset: Dataset
    scheduler: Any
    ranks: Ranks
    device: str
    architecture: str
    """Class name of the Hugging Face model that was built."""
    num_params: int

    kind = "plain"
    """``plain``, ``zero3`` or ``fsdp``: which job ``profiler.jobs.open_job`` builds again from a manifest."""
    setup = ""
    """How the ranks hold the job, in words (``ZeRO-3``, ``FSDP2``; empty in one process)."""
    integration = "LayerCheck"
    """The LayerCheck class ``make_layercheck`` attaches (named in traces and costs)."""
    sources_key: str | None = None
    """The key of ``manifest.sources`` that details a multi-rank setup."""

    @property
    def model(self) -> torch.nn.Module:
        """What LayerCheck maps into layers."""
        raise NotImplementedError

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        raise NotImplementedError

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        raise NotImplementedError

    def evaluate(self) -> float:
        raise NotImplementedError

    def make_layercheck(self, directory: Any, config: Any) -> Any:
        raise NotImplementedError

    def command(self, argv: list[str] | None) -> str | None:
        """The command line that ran this job (None when called from Python)."""
        return "python -m profiler " + " ".join(argv) if argv else None

    def manifest_parts(self, argv: list[str] | None) -> dict[str, Any]:
        """What a trace says about this kind of job: ``setup`` and ``detail`` (the
        description's words before and after the job's own), and extra keys of
        ``sources``, ``machine`` and ``model``."""
        return {"setup": "", "detail": f", on {self.device}", "sources": {},
                "machine": {}, "model": {}}

    def default_name(self) -> str:
        lora = f"-lora{self.config.lora}" if getattr(self.config, "lora", None) else ""
        return f"{self.source.label}{lora}-{self.config.steps}steps"

    @property
    def lr_peak(self) -> float:
        return float(self.config.lr or self.source.default_lr)

    @property
    def metric_name(self) -> str:
        kind = "masked-LM" if self.source.objective == "masked" else "next-token"
        shown = min(self.config.eval_sequences, len(self.dataset.heldout))
        return f"held-out {kind} loss ({shown} sequences)"


def build_model_and_data(config: CaptureConfig, source: ModelSource | None = None
                         ) -> tuple[ModelSource, Any, Corpus, Dataset]:
    """The model (train mode, weights fixed by the seed) and the data of ``config``.
    LayerCheck's drift kernels are loaded here too: a process pays that once, at
    start-up, not inside its first step's drift time."""
    _warm_drift_kernels()
    source = source or resolve_model(config.model)
    model, tokenizer = source.build(seed=config.seed, max_len=config.seq_len)
    if config.lora is not None:  # the adapter's A is drawn from the RNG build() seeded
        from ..models import with_lora
        model = with_lora(model, config.lora)
    corpus = load_corpus(source.corpus)
    dataset = Dataset.build(corpus, tokenizer, objective=source.objective,
                            seq_len=config.seq_len, batch_size=config.batch_size,
                            seed=config.seed)
    return source, model, corpus, dataset


def _warm_drift_kernels() -> None:
    try:
        from layercheck.drift.kernels import warm
    except ImportError:  # no numba: drift takes the torch path, nothing to load
        return
    warm()


def adamw(model: torch.nn.Module, config: CaptureConfig, source: ModelSource
          ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW on two groups per layer (decay on matrices only), and its LR schedule."""
    from layercheck.groups import layer_aligned_param_groups
    optimizer = torch.optim.AdamW(layer_aligned_param_groups(model, weight_decay=config.weight_decay),
                                  lr=config.lr or source.default_lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(config))


def lr_schedule(config: CaptureConfig) -> Callable[[int], float]:
    total = config.steps
    warm = max(1, round(config.lr_warmup_fraction * total))

    def factor(done: int) -> float:  # done = optimizer steps already taken
        if done < warm:
            return (done + 1) / warm
        return max(0.0, (total - done) / max(1, total - warm + 1))
    return factor


def predicted_tokens(labels: torch.Tensor, objective: str) -> int:
    if objective == "masked":
        return int((labels != -100).sum())
    return int(labels[:, 1:].numel())


def has_bert_head(model: Any) -> bool:
    return hasattr(model, "bert") and hasattr(model, "cls")


def masked_token_losses(model: Any, input_ids: torch.Tensor, labels: torch.Tensor,
                        reduction: str) -> torch.Tensor:
    """BertForMaskedLM's loss with the vocabulary projection applied only at the
    masked positions (15% of them): the same value, and on MiniLM about half
    the compute of projecting every position onto 30,522 words."""
    hidden = model.bert(input_ids=input_ids).last_hidden_state
    chosen = labels != -100
    logits = model.cls(hidden[chosen])
    return torch.nn.functional.cross_entropy(logits, labels[chosen], reduction=reduction)


def timer(device: str) -> Callable[[], float]:
    """A clock that waits for the GPU first (phase times must include the work)."""
    if device.startswith("cuda"):
        def now() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return now
    return time.perf_counter
