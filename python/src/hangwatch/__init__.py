"""hangwatch client: progress beats, phases and log records for the hangwatch agent; never blocks, never raises.

Importing this package imports nothing beyond the standard library; the framework integrations live in
`hangwatch.integrations.*` and are imported only when asked for.
"""

from hangwatch._client import beat, flush, stats
from hangwatch._logging import LoggingHandler
from hangwatch._phase import evaluation, phase
from hangwatch._rank import report as report_rank
from hangwatch._rank import start_watcher as _start_rank_watcher
from hangwatch._version import __version__

__all__ = ["beat", "phase", "evaluation", "LoggingHandler", "report_rank", "stats", "flush", "__version__"]

# Under an agent: say which rank this process is once torch.distributed is initialized (see _rank.py).
_start_rank_watcher()
