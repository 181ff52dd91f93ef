"""The rank's answer to the agent's roll call: what PyTorch's Flight Recorder says of its collectives.

At a roll call the agent sends `hw1 dump-collectives <id>` to each rank's socket (the client binds it to an
abstract address, and a connected datagram socket takes datagrams from the agent alone). The rank's watcher thread,
which reported the rank once `torch.distributed` was initialized, says `hw1 listen collectives` from each socket it
answers on (again after a reconnect: the address is the socket's), then waits for requests, blocked in `select`
(no CPU). It dumps the recorder (`_dump_fr_trace_json`), keeps per process group its progress and its last
`KEEP` collectives with the fields the analysis reads, and sends them as one `collectives` message. A rank that
holds the GIL in a C call or sleeps in D never answers: the agent does not wait for it past its deadline.

The recorder records only when `TORCH_FR_BUFFER_SIZE` (or `TORCH_NCCL_TRACE_BUFFER_SIZE`) is above 0; `hangwatch run`
sets it for the ranks it starts unless the job did (docs/inside-evidence.md).
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from typing import Any, Dict, List, Optional

from hangwatch import _client

KEEP = 16
"""Collectives kept per process group: the analysis needs the last few; the message must stay under 65,000 bytes."""

POLL_S = 5.0
"""How long a wait for a request lasts before the thread looks whether the socket was replaced (a reconnect)."""

_ENTRY_FIELDS = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes", "state", "is_p2p")

REQUEST = b"hw1 dump-collectives "


def recording() -> bool:
    """Whether the Flight Recorder records in this process (its buffer size is set above 0)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def trimmed(dump: bytes, keep: int = KEEP) -> Optional[bytes]:
    """The recorder's JSON dump reduced to the groups' progress and their last `keep` collectives (point-to-point
    operations left out); None when it is not a dump."""
    try:
        doc = json.loads(dump)
        by_group: Dict[str, List[Dict[str, Any]]] = {}
        for entry in doc.get("entries") or []:
            if entry.get("is_p2p"):
                continue
            group = (entry.get("process_group") or [""])[0]
            kept = {k: entry[k] for k in _ENTRY_FIELDS if k in entry}
            kept["process_group"] = [group]
            by_group.setdefault(group, []).append(kept)
        entries: List[Dict[str, Any]] = []
        for group_entries in by_group.values():
            group_entries.sort(key=lambda e: e.get("collective_seq_id", 0))
            entries.extend(group_entries[-keep:])
        out = {"version": doc.get("version"), "pg_status": doc.get("pg_status") or {}, "entries": entries}
        return json.dumps(out, separators=(",", ":")).encode()
    except Exception:
        return None


def dump() -> Optional[bytes]:
    """This process's Flight Recorder, trimmed; None when torch.distributed or the recorder is not there."""
    try:
        c10d = sys.modules.get("torch._C._distributed_c10d")
        if c10d is None:
            import torch._C._distributed_c10d as c10d  # noqa: F811 (imported by torch.distributed already)
        raw = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        return trimmed(raw if isinstance(raw, bytes) else str(raw).encode())
    except Exception:
        return None


def answer(request: bytes) -> bool:
    """Answer one request datagram (`hw1 dump-collectives <id>`); True when it was one."""
    if not request.startswith(REQUEST):
        return False
    ident = request[len(REQUEST) :].strip()[:20]
    if not ident.isdigit():
        return False
    body = dump()
    if body is None:
        body = b"{}"
    _client.post(b"collectives", ident + b"\n" + body, "collectives")
    return True


def serve(stop: Optional[threading.Event] = None) -> None:
    """Answer the agent's requests for as long as the process lives (the rank watcher's thread, after the rank was
    reported), or until `stop` is set (tests). Never raises."""
    announced = None
    while stop is None or not stop.is_set():
        try:
            sock = _client._sock
            if sock is None:
                _client._connect_if_due()
                select.select([], [], [], POLL_S)
                continue
            if sock is not announced:
                # The agent asks only the processes that said they answer, at the address they said it from.
                _client.post(b"listen", b"collectives", "listen")
                announced = sock
            readable, _, _ = select.select([sock], [], [], POLL_S)
            if not readable:
                continue
            while True:
                try:
                    request = sock.recv(256)
                except (BlockingIOError, InterruptedError):
                    break
                answer(request)
        except (OSError, ValueError):
            # The socket was closed under us (a reconnect): take the new one.
            select.select([], [], [], 1.0)
        except Exception:
            return
