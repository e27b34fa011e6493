"""``python -m profiler``: see profiler.cli."""
from .cli import main
from .launch import leave, release_process_group

try:
    code = main()
except BaseException:  # its message or traceback still prints, as the interpreter ends
    release_process_group()
    raise
leave(code)  # a rank under torchrun skips the interpreter's teardown (see launch.leave)
