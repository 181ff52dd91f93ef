"""Tells the agent which rank this process is, once the process itself knows.

The agent finds ranks by their starting environment (`RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, ...) or by the
process tree (the children `torch.multiprocessing.spawn` started, in start order: a guess). Jobs that learn their
rank at run time (mp.spawn's function argument, Lightning's launcher, `os.environ["RANK"] = os.environ["SLURM_PROCID"]`)
are only known for sure here: once `torch.distributed` is initialized, or when Lightning's callback sees the trainer.
One `rank` message per value (protocol hw1, see docs/wire-protocol.md); an older agent ignores it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from hangwatch import _client

WATCH_INTERVAL_S = 0.5
"""How often the watcher thread looks whether `torch.distributed` was initialized (a dictionary lookup when not)."""

_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")

_sent: Optional[tuple] = None
_watcher: Optional[threading.Thread] = None
_lock = threading.Lock()


def report(rank: Any, local_rank: Any = None, world_size: Any = None, via: str = "torch") -> bool:
    """Say that this process is `rank` (of `world_size`, local rank `local_rank`); True when a message was queued.
    The same values are said once. Never raises."""
    global _sent
    try:
        rank = int(rank)
        if rank < 0:
            return False
        local = _number(local_rank)
        world = _number(world_size)
        key = (rank, local, world)
        with _lock:
            if _sent == key or not _client.enabled():
                return False
            _sent = key
        rest = b"%d %s %s %s" % (rank, _field(local), _field(world), via.encode("ascii", "replace")[:32])
        _client.post(b"rank", rest, "rank")
        return True
    except Exception:
        return False


def report_from_torch() -> bool:
    """Report the rank `torch.distributed` knows, if it is imported and initialized; True when it was."""
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
        local = next((os.environ[v] for v in _LOCAL_RANK_VARS if os.environ.get(v, "").isdigit()), None)
        report(dist.get_rank(), local, dist.get_world_size(), "torch")
        return True
    except Exception:
        return False


def start_watcher() -> None:
    """Start the daemon thread that reports the rank once `torch.distributed` is initialized (then answers the
    agent's requests for the Flight Recorder: _flight.py). Only in a process
    the agent watches, and never in a forked child (a DataLoader worker inherits its rank's initialized state but is
    not a rank)."""
    global _watcher
    try:
        if _watcher is not None or not os.environ.get(_client.ENV_SOCKET) or _client._slot_forked:
            return
        _watcher = threading.Thread(target=_watch, name="hangwatch-rank", daemon=True)
        _watcher.start()
    except Exception:
        pass


def _watch() -> None:
    event = threading.Event()
    while not report_from_torch():
        event.wait(WATCH_INTERVAL_S)
    # A rank of a torch.distributed job: the thread stays to answer the agent's roll calls with its Flight Recorder
    # (_flight.py; an empty record where it does not record), blocked in select in between.
    from hangwatch import _flight

    _flight.serve()


def _number(value: Any) -> Optional[int]:
    try:
        n = int(value)
        return n if n >= 0 else None
    except Exception:
        return None


def _field(value: Optional[int]) -> bytes:
    return b"-" if value is None else b"%d" % value


def _after_fork_in_child() -> None:
    global _sent, _watcher, _lock
    _sent = None
    _watcher = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
