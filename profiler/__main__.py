"""``python -m profiler``: see profiler.cli."""
import sys

from .cli import main


def _release_process_group() -> None:
    """A rank under torchrun ends its default process group before the interpreter
    does: left to interpreter teardown, gloo's threads can outlive it, and the rank
    aborts ("terminate called without an active exception") after its work is done."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


try:
    code = main()
finally:
    _release_process_group()
sys.exit(code)
