"""DeepSpeed's strategy for real: a synchronous full save of model and optimizer.

``engine.save_checkpoint`` (``profiler.engine``) when DeepSpeed is installed (not for a
one-process job inside a world of several ranks), else one safetensors file written,
fsynced and renamed into place; for an FSDP2 job (which has no DeepSpeed engine) its own
framework's full save, ``torch.distributed.checkpoint.save`` of every rank's shards.
Durable when the save returns; loaded with ``engine.load_checkpoint`` (or ``dcp.load``).
Disk stays one save deep. LowDiff's full checkpoints are this class's saves.
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from ..state import TrainingState, fsync_path
from .base import Checkpointer, Resume, Saved, folder_bytes

__all__ = ["FullCheckpointer"]


class FullCheckpointer(Checkpointer):

    def __init__(self, job: Any, folder: Path, *, interval: int = 1) -> None:
        super().__init__(job, folder, interval=interval)
        self.sharded = job.kind == "fsdp"
        """FSDP2: the state is DTensor shards, saved with DCP by every rank."""
        self.engine = None if self.sharded else _engine(job)
        self.state = TrainingState(job.model, job.optimizer, job.scheduler)

    @property
    def method(self) -> str:
        if self.sharded:
            return ("torch.distributed.checkpoint.save (synchronous: every rank writes its "
                    "DTensor shards of weights and Adam moments, rank 0 the metadata)")
        if self.engine is not None:
            return ("DeepSpeed engine.save_checkpoint (torch.save of module, optimizer, "
                    "scheduler and client state; DeepSpeed does not fsync)")
        return "a safetensors file of weights and Adam moments, written, fsynced and renamed"

    def save(self, step: int, position: int) -> Saved:
        start = time.perf_counter()
        tag = f"step{step}"
        if self.engine is not None:
            self.engine.save_checkpoint(str(self.folder), tag=tag,
                                        client_state={"step": step, "position": position})
        elif self.sharded:
            import torch.distributed.checkpoint as dcp
            dcp.save({"tensors": self.state.tensors(), "meta": self.state.meta(step, position)},
                     checkpoint_id=str(self.folder / tag))
        else:
            self._save_safetensors(tag, step, position)
        stall = time.perf_counter() - start
        nbytes = folder_bytes(self.folder / tag) if self.job.ranks.is_coordinator else 0
        self._prune(keep=tag)
        return Saved(stall, bytes=nbytes)

    def load(self) -> Resume | None:
        if self.engine is not None:
            tag = self._deepspeed_tag()
            if tag is None:
                return None
            _, client = self.engine.load_checkpoint(str(self.folder), tag=tag)
            return Resume(int(client["step"]), int(client["position"]))
        if self.sharded:
            return self._load_dcp()
        return self._load_safetensors()

    def _deepspeed_tag(self) -> str | None:
        """The save DeepSpeed's ``latest`` names, or None before the first save.

        DeepSpeed rewrites ``latest`` in place (open, truncate, write) once a save's
        files are written, so a kill in between leaves it empty with that save whole
        on disk (a validation worker met it): then the newest ``step*`` save holding
        DeepSpeed's model states is the one, said in a warning."""
        latest = self.folder / "latest"
        if not latest.exists():
            return None
        tag = latest.read_text().strip()
        if tag and (self.folder / tag).is_dir():
            return tag
        saves = sorted((p.parent for p in self.folder.glob("step*/*model_states.pt")),
                       key=lambda p: int(p.name[4:]))
        if not saves:
            return None
        named = f"names {tag!r}, which is not there" if tag else "is empty"
        warnings.warn(f"DeepSpeed's {latest} {named} (killed while DeepSpeed rewrote it); "
                      f"loading {saves[-1].name}, the newest save on disk", stacklevel=2)
        return saves[-1].name

    def _load_dcp(self) -> Resume | None:
        import torch.distributed.checkpoint as dcp
        done = sorted((p.parent for p in self.folder.glob("step*/.metadata")),
                      key=lambda p: int(p.name[4:]))
        if not done:
            return None
        state = {"tensors": self.state.tensors(), "meta": self.state.meta(0, 0)}
        dcp.load(state, checkpoint_id=str(done[-1]))
        step, position = self.state.apply_meta(state["meta"])
        return Resume(step, position)

    def _save_safetensors(self, tag: str, step: int, position: int) -> None:
        from safetensors.torch import save_file
        final = self.folder / tag / "state.safetensors"
        final.parent.mkdir(exist_ok=True)
        tmp = final.with_suffix(".tmp")
        meta = {k: str(v) for k, v in self.state.meta(step, position).items()}
        save_file({k: t.contiguous() for k, t in self.state.tensors().items()}, str(tmp),
                  metadata=meta)
        fsync_path(tmp)
        os.replace(tmp, final)
        fsync_path(final.parent)

    def _load_safetensors(self) -> Resume | None:
        from safetensors import safe_open
        done = sorted((p for p in self.folder.glob("step*/state.safetensors")),
                      key=lambda p: int(p.parent.name[4:]))
        if not done:
            return None
        live = self.state.tensors()
        with safe_open(str(done[-1]), "pt") as f:
            for key in f.keys():
                live[key].copy_(f.get_tensor(key))
            meta = f.metadata()
        step, position = self.state.apply_meta(meta)
        return Resume(step, position)

    def _prune(self, keep: str) -> None:
        """Drop older saves once a newer one is complete (disk stays one save deep)."""
        if not self.job.ranks.is_coordinator:
            return
        for old in self.folder.glob("step*"):
            if old.is_dir() and old.name != keep:
                shutil.rmtree(old, ignore_errors=True)


def _engine(job: Any) -> Any:
    """The DeepSpeed engine that saves ``job``: its own (a ZeRO job's), else a world-size-1
    engine around it; None without DeepSpeed, or for a one-process job inside a world of
    several ranks (rank 0's plain job in a ZeRO calibration), which an engine would span."""
    import torch.distributed as dist

    from ..engine import deepspeed_available, engine_for
    if not deepspeed_available():
        return None
    if getattr(job, "engine", None) is None and dist.is_initialized() and dist.get_world_size() > 1:
        return None
    return engine_for(job)
