"""``python -m profiler``: see profiler.cli."""
import sys

from .cli import main

sys.exit(main())
