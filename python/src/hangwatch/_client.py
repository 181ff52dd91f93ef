"""The process's link to the hangwatch agent: socket, framing (protocol hw1), seq numbers, drop counts, fork reset.

Beats go into this rank's slot of a shared-memory file the agent made (`HANGWATCH_BEATS`): one store, no system
call; the agent reads the slots at its tick. The slot belongs to the process that holds its lock, taken at its
first beat; a descendant of that owner (a DataLoader worker, whether forked, spawned or started by a
forkserver) is not a rank and sends no beats. Without the file, or with the slot held by a process that is not an
ancestor, beats are lossy datagrams: one non-blocking send, dropped and counted when the agent cannot take them.
Hello, phase and log messages are kept in order: sent directly when the socket takes them, otherwise held in a
bounded in-memory queue that a daemon thread drains. Nothing here blocks or raises into the caller.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, Optional

from hangwatch._version import __version__

ENV_SOCKET = "HANGWATCH_SOCKET"
ENV_BEATS = "HANGWATCH_BEATS"
SLOT_BYTES = 64
"""A slot: count u64, step i64 (-1: none), pid u64, rank + 1 u64 (little-endian); see crates/agent/src/beats.rs."""
PROTOCOL = b"hw1"
MAX_MESSAGE_BYTES = 65_000
"""No datagram is longer; longer log records are cut and marked (see wire-protocol.md)."""

RECONNECT_INTERVAL_S = 1.0
"""At most one connect attempt per interval while the agent is unreachable, so a missing agent costs no syscalls."""

QUEUE_MAX_MESSAGES = 10_000
QUEUE_MAX_BYTES = 16 * 1024 * 1024
"""Bounds of the ordered queue for hello/phase/log messages; past either, new messages are dropped and counted."""

_SEQ_DIGITS = 20
"""Room kept for the seq field when a message is cut to `MAX_MESSAGE_BYTES` before its seq is known."""

IDLE_THREAD_EXIT_S = 5.0
"""The drain thread ends after this long with nothing queued, so an idle process carries no extra thread."""

_UNINIT, _DISABLED, _DOWN, _UP = range(4)

_PEER_GONE = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ENOTCONN,
        errno.ENOENT,
        errno.EPIPE,
        errno.ECONNRESET,
        errno.EBADF,
        errno.EDESTADDRREQ,
        errno.ENOTSOCK,
    }
)
"""Send errors after which the socket is useless and a reconnect may help (agent gone or restarted)."""

# Hot-path state lives in module globals: a global load is the cheapest lookup CPython offers.
_send: Any = None
_slot: Any = None
"""This rank's 16 bytes (count, step) of the beat slots, when mapped."""
_slot_map: Any = None
_slot_count = 0
_datagram_beats = 0
"""Beats sent (or tried) by datagram: with `_slot_count`, every beat this process made (`beat_count()`)."""
_slot_pack = struct.Struct("<Qq").pack_into
_slot_fd = -1
"""The descriptor whose open file description holds this process's lock on its slot: kept open for the process's
life, since closing it (and the mapping's own copy) releases the lock."""
_slot_tried = False
"""Whether this process has tried to take its slot (once, at its first beat)."""
_slot_state = "untried"
"""What the slot is to this process, for `stats()`: `untried`, `owned`, `worker` (an ancestor owns it: this process
is not a rank and sends no beats), `other` (a process that is not an ancestor owns it: beats by datagram), or
`unavailable` (no file, or it cannot serve this slot: beats by datagram)."""
_slot_lock = threading.Lock()
_slot_forked = False
"""Set in a forked child: it never reports a rank (it inherited its rank's state but is not one)."""
_MAX_ANCESTORS = 32
"""How many parents up a slot's owner is looked for (the agent's own limit for members, crates/agent/members.rs)."""
_beat_prefix = b""
_beat_format = b""
_beat_no_step = b""
_seq_counter = itertools.count(1)
_next_seq = _seq_counter.__next__

_mode = _UNINIT
_path: Optional[str] = None
_sock: Optional[socket.socket] = None
_header_tail = b""
_local_rank = b"-"
_retry_at = 0.0
_conn_lock = threading.Lock()
_stats_lock = threading.Lock()
_dropped: Dict[str, int] = {"hello": 0, "beat": 0, "phase": 0, "log": 0}
_warned: set = set()


def beat(step: Optional[int] = None) -> None:
    """One unit of progress; `step` is the training step if the caller knows it."""
    slot = _slot
    if slot is not None:
        global _slot_count
        _slot_count += 1
        try:
            _slot_pack(slot, 0, _slot_count, -1 if step is None else step)
        except Exception:
            _slot_odd_step(slot, step)
        return
    global _datagram_beats
    _datagram_beats += 1
    send = _send
    if send is None or not _slot_tried:
        if _mode != _DISABLED:
            _beat_cold(step)
        return
    seq = _next_seq()
    try:
        if step is None:
            send(_beat_no_step % seq)
        else:
            send(_beat_format % (seq, step))
    except BlockingIOError:
        _drop("beat")
    except OSError as exc:
        _send_failed(send, exc, "beat")
    except Exception:
        _beat_odd_step(send, seq, step)


def beat_count() -> int:
    """How many times this process called `beat()` (slot and datagram alike)."""
    return _slot_count + _datagram_beats


def _slot_odd_step(slot: Any, step: Any) -> None:
    """A step that does not pack as a 64-bit integer (a string, an object, a huge number): its integer value if
    it has one that fits, else none."""
    try:
        value = int(step)
        if not -(1 << 63) <= value < (1 << 63):
            value = -1
    except Exception:
        value = -1
    try:
        _slot_pack(slot, 0, _slot_count, value)
    except Exception:
        pass


def _beat_cold(step: Any) -> None:
    """Beat while not connected (first call of the process, no agent configured, or agent unreachable) or before
    this process has tried to take its slot."""
    try:
        connected = _connect_if_due()
        if _mode == _DISABLED:
            return
        if not _slot_tried:
            _claim_slot()
        if _slot is not None or (connected and _slot_tried):
            beat(step)
        else:
            _next_seq()
            _drop("beat")
    except Exception:
        pass


def _beat_odd_step(send: Any, seq: int, step: Any) -> None:
    """A step that `%d` refuses (a string, an object): send its integer value if it has one, else `-`."""
    try:
        value = b"%d" % int(step)
    except Exception:
        value = b"-"
    try:
        send(_beat_prefix + b"%d " % seq + value)
    except BlockingIOError:
        _drop("beat")
    except OSError as exc:
        _send_failed(send, exc, "beat")
    except Exception:
        _drop("beat")


def post(mtype: bytes, rest: bytes, kind: str) -> None:
    """Send a hello/phase/log message in order with the others of its kind; never blocks, never raises."""
    try:
        if _send is None and not _connect_if_due() and _mode == _DISABLED:
            return
        room = MAX_MESSAGE_BYTES - len(PROTOCOL + b"  " + mtype + _header_tail) - _SEQ_DIGITS
        if len(rest) > room:
            rest = truncate(rest, room)
        _outbox.put(_Item(mtype, rest, kind))
    except Exception:
        pass


def enabled() -> bool:
    """Whether `HANGWATCH_SOCKET` names an agent for this process (reachable or not)."""
    if _mode == _UNINIT:
        _init_from_env()
    return _mode != _DISABLED


def truncate(data: bytes, limit: int) -> bytes:
    """Cut `data` to at most `limit` bytes on a UTF-8 character boundary and say how much was cut."""
    if len(data) <= limit:
        return data
    keep = limit - len(b" [truncated  bytes]") - len(b"%d" % len(data))
    while keep > 0 and (data[keep] & 0xC0) == 0x80:
        keep -= 1
    return data[:keep] + b" [truncated %d bytes]" % (len(data) - keep)


def stats() -> Dict[str, Any]:
    """Counts since this process started (or forked): what reached the socket, what was dropped, what waits."""
    if _mode == _UNINIT:
        _init_from_env()
    with _stats_lock:
        by_type = dict(_dropped)
    dropped = sum(by_type.values())
    queued = _outbox.pending()
    sent = _seq_used() - dropped - _outbox.pending_with_seq()
    return {
        "enabled": _mode != _DISABLED,
        "connected": _send is not None,
        "socket": _path,
        "sent": max(0, sent),
        "dropped": dropped,
        "queued": queued,
        "dropped_by_type": by_type,
        "beats_in_slot": _slot_count if _slot_state == "owned" else 0,
        "beat_slot": _slot_state,
    }


def flush(timeout: float = 2.0) -> bool:
    """Wait up to `timeout` seconds for queued messages to reach the socket; True when nothing is left."""
    return _outbox.wait_empty(timeout)


def _seq_used() -> int:
    """How many seq numbers were handed out; read from the counter's repr because reading must not consume one."""
    text = repr(_seq_counter)
    try:
        return int(text[text.index("(") + 1 : -1]) - 1
    except ValueError:
        return 0


def _drop(kind: str) -> None:
    with _stats_lock:
        _dropped[kind] = _dropped.get(kind, 0) + 1


def _warn_once(key: str, text: str) -> None:
    """One line on stderr per process and cause, so a missing agent is visible without flooding the job's output."""
    if key in _warned:
        return
    _warned.add(key)
    try:
        sys.stderr.write("hangwatch: " + text + "\n")
    except Exception:
        pass


def _init_from_env() -> None:
    global _mode, _path, _header_tail, _beat_prefix, _beat_format, _beat_no_step, _local_rank, _retry_at
    with _conn_lock:
        if _mode != _UNINIT:
            return
        path = os.environ.get(ENV_SOCKET, "")
        if not path:
            _mode = _DISABLED
            return
        rank = _field(os.environ.get("RANK"))
        _local_rank = _field(os.environ.get("LOCAL_RANK"))
        pid = b"%d" % os.getpid()
        _path = path
        _beat_prefix = PROTOCOL + b" beat " + rank + b" " + pid + b" "
        _beat_format = _beat_prefix + b"%d %d"
        _beat_no_step = _beat_prefix + b"%d -"
        _header_tail = b" " + rank + b" " + pid + b" "
        _retry_at = 0.0
        _mode = _DOWN


def _claim_slot() -> None:
    """Takes this process's beat slot (slot LOCAL_RANK, else RANK, else 0) at its first beat, and writes its pid and
    rank there.

    Why a lock and not the environment: a DataLoader worker started by spawn or forkserver re-imports hangwatch
    with its rank's environment and would otherwise overwrite the rank's pid; once it exited the agent would ignore
    the rank's beats. A lock on the slot's bytes has one holder, and the kernel releases it when its holder exits
    (a restarted rank takes the slot again). Taking it never waits. A process that finds the slot held by one of
    its ancestors is that rank's worker and sends no beats; held by anyone else (`torch.multiprocessing.spawn`'s
    ranks, which share slot 0), its beats go by datagram. Any problem leaves beats on datagrams, said once."""
    global _slot, _slot_map, _slot_fd, _slot_tried, _slot_state, _slot_count
    if not _slot_lock.acquire(blocking=False):
        return
    try:
        if _slot_tried:
            return
        _slot_tried = True
        _slot_state = "unavailable"
        path = os.environ.get(ENV_BEATS, "")
        if not path:
            return
        try:
            index = int(os.environ.get("LOCAL_RANK") or os.environ.get("RANK") or 0)
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
            try:
                size = os.fstat(fd).st_size
                if index < 0 or (index + 1) * SLOT_BYTES > size:
                    raise ValueError("slot %d is beyond the %d slots of %s" % (index, size // SLOT_BYTES, path))
                try:
                    _lock_slot(fd, index * SLOT_BYTES)
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    owner = struct.unpack("<Q", os.pread(fd, 8, index * SLOT_BYTES + 16))[0]
                    os.close(fd)
                    if _is_ancestor(owner):
                        # Not a rank: a private buffer takes its beats, so that the hot path stays one store.
                        _slot_state = "worker"
                        _slot = memoryview(bytearray(16))
                    else:
                        _slot_state = "other"
                    return
                mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
            view = memoryview(mapped)[index * SLOT_BYTES : index * SLOT_BYTES + 32]
            rank = (os.environ.get("RANK") or "").strip()
            # A previous owner's count goes on, so that the agent never sees it fall.
            _slot_count = struct.unpack_from("<Q", view, 0)[0]
            struct.pack_into("<QQ", view, 16, os.getpid(), int(rank) + 1 if rank.isdigit() else 0)
            _slot_fd = fd
            _slot_map = mapped
            _slot = view[:16]
            _slot_state = "owned"
        except (OSError, ValueError) as exc:
            _warn_once("slot", "cannot use the beat slots at %s (%s); beats go by datagram" % (path, exc))
    finally:
        _slot_lock.release()


_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)


def _lock_slot(fd: int, start: int) -> None:
    """Locks one slot's bytes for writing without waiting; OSError(EAGAIN or EACCES) when another holds them.

    An open-file-description lock (Linux 3.15+) belongs to this open of the file: closing another descriptor of
    the same file (a tool that reads the slots, a test) does not release it, as it would a POSIX record lock. A
    forked child shares the description until it closes its copies, which the fork hook does at once."""
    if _OFD_SETLK is None:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SLOT_BYTES, start)
        return
    flock = struct.pack("@hhqqi0q", fcntl.F_WRLCK, os.SEEK_SET, start, SLOT_BYTES, 0)
    fcntl.fcntl(fd, _OFD_SETLK, flock)


def _is_ancestor(pid: int) -> bool:
    """Whether `pid` is this process's parent, grandparent, ... (through `/proc/PID/stat`, which never waits on
    the process's memory)."""
    if pid <= 1:
        return False
    current = os.getppid()
    for _ in range(_MAX_ANCESTORS):
        if current == pid:
            return True
        if current <= 1:
            return False
        try:
            with open("/proc/%d/stat" % current, "rb") as f:
                stat = f.read()
            current = int(stat[stat.rindex(b")") + 2 :].split(b" ", 2)[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _field(value: Optional[str]) -> bytes:
    """A rank from the environment as one protocol field: its digits, or `-` when absent or not a number."""
    value = (value or "").strip()
    if not value.isdigit() or not value.isascii():
        return b"-"
    return value.encode("ascii")


def _address(path: str) -> Any:
    """`@name` is a Linux abstract socket: no file, so nothing on any filesystem is touched to reach the agent."""
    if path.startswith("@"):
        return "\0" + path[1:]
    return path


def _open(address: Any) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        # An abstract address of the kernel's choosing, so that the agent can ask this process for its collectives
        # (_flight.py); connected, the socket takes datagrams from the agent alone. Without it, only asking fails.
        try:
            sock.bind("")
        except OSError:
            pass
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def _connect_if_due() -> bool:
    """Connect when configured, not connected, and the last failed attempt is old enough; True when connected."""
    global _mode, _sock, _send, _retry_at
    if _send is not None:
        return True
    if _mode == _UNINIT:
        _init_from_env()
    if _mode == _DISABLED or _path is None:
        return False
    now = time.monotonic()
    if now < _retry_at:
        return False
    if not _conn_lock.acquire(blocking=False):
        return _send is not None
    failure: Optional[OSError] = None
    try:
        if _send is not None:
            return True
        try:
            sock = _open(_address(_path))
        except OSError as exc:
            _retry_at = now + RECONNECT_INTERVAL_S
            failure = exc
        else:
            _sock = sock
            _mode = _UP
            _send = sock.send
    finally:
        _conn_lock.release()
    if failure is not None:
        # A node service's watcher starts a few seconds after the ranks it watches (its TaskProlog says so).
        if os.environ.get("HANGWATCH_AGENT_LATER") == "1":
            return False
        _warn_once(
            "unreachable",
            "cannot reach the agent at %s (%s); heartbeats are dropped and counted, see hangwatch.stats()"
            % (_path, failure.strerror or failure),
        )
        return False
    post(b"hello", _local_rank + b" " + __version__.encode(), "hello")
    return True


def _send_failed(send: Any, exc: OSError, kind: Optional[str]) -> None:
    """A send error: count the message (when `kind`), and drop the socket if the agent is gone so we reconnect."""
    global _mode, _sock, _send, _retry_at
    if kind is not None:
        _drop(kind)
    if exc.errno not in _PEER_GONE:
        return
    with _conn_lock:
        if _send is not send:
            return
        _send = None
        _mode = _DOWN
        _retry_at = time.monotonic() + RECONNECT_INTERVAL_S
        sock, _sock = _sock, None
    _warn_once(
        "lost",
        "lost the agent at %s (%s); messages are dropped and counted until it is back" % (_path, exc.strerror or exc),
    )
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


def _wait_writable(timeout: float) -> None:
    sock = _sock
    try:
        if sock is not None:
            select.select([], [sock], [], timeout)
            return
    except (OSError, ValueError):
        pass
    time.sleep(timeout)


class _Item:
    """A hello/phase/log message; its seq is taken at the first send attempt, so seqs reach the agent in order."""

    __slots__ = ("mtype", "rest", "kind", "seq")

    def __init__(self, mtype: bytes, rest: bytes, kind: str) -> None:
        self.mtype = mtype
        self.rest = rest
        self.kind = kind
        self.seq = 0

    def frame(self) -> bytes:
        if not self.seq:
            self.seq = _next_seq()
        return PROTOCOL + b" " + self.mtype + _header_tail + b"%d " % self.seq + self.rest

    def drop(self) -> None:
        """Count it; a seq is still used up so the agent sees the gap."""
        if not self.seq:
            self.seq = _next_seq()
        _drop(self.kind)


class _Outbox:
    """Ordered, bounded queue of hello/phase/log datagrams; direct send while it is empty, daemon thread otherwise."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.items: Deque[_Item] = deque()
        self.nbytes = 0
        self.inflight: Optional[_Item] = None
        self.thread: Optional[threading.Thread] = None
        self.closed = False

    def pending(self) -> int:
        return len(self.items) + (1 if self.inflight is not None else 0)

    def pending_with_seq(self) -> int:
        with self.lock:
            waiting = [self.inflight] + list(self.items)
        return sum(1 for item in waiting if item is not None and item.seq)

    def put(self, item: _Item) -> None:
        if not self._put(item):
            item.drop()
            _warn_once(
                "overflow",
                "the agent is not taking messages and %d are queued; new log/phase messages are dropped "
                "and counted, see hangwatch.stats()" % len(self.items),
            )

    def _put(self, item: _Item) -> bool:
        """False when the queue is full (the caller counts and warns outside the lock)."""
        with self.lock:
            if not self.items and self.inflight is None:
                send = _send
                if send is not None:
                    try:
                        send(item.frame())
                        return True
                    except BlockingIOError:
                        pass
                    except OSError as exc:
                        if exc.errno not in _PEER_GONE:
                            item.drop()
                            return True
                        _send_failed(send, exc, None)
            size = len(item.rest)
            if len(self.items) >= QUEUE_MAX_MESSAGES or self.nbytes + size > QUEUE_MAX_BYTES:
                return False
            self.items.append(item)
            self.nbytes += size
            if self.thread is None or not self.thread.is_alive():
                thread = threading.Thread(target=self._run, name="hangwatch-outbox", daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    return True
                self.thread = thread
            else:
                self.cond.notify_all()
            return True

    def wait_empty(self, timeout: float) -> bool:
        with self.lock:
            return self.cond.wait_for(lambda: not self.items and self.inflight is None, timeout)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.cond.notify_all()

    def _run(self) -> None:
        try:
            self._drain()
        finally:
            with self.lock:
                if self.thread is threading.current_thread():
                    self.thread = None

    def _drain(self) -> None:
        while True:
            with self.lock:
                while not self.items and not self.closed:
                    if not self.cond.wait(IDLE_THREAD_EXIT_S) and not self.items:
                        return
                if self.closed:
                    return
                item = self.items.popleft()
                self.nbytes -= len(item.rest)
                self.inflight = item
            try:
                self._deliver(item)
            except Exception:
                item.drop()
            with self.lock:
                self.inflight = None
                self.cond.notify_all()

    def _deliver(self, item: _Item) -> None:
        while not self.closed:
            send = _send
            if send is None:
                if _connect_if_due():
                    continue
                if _mode == _DISABLED:
                    item.drop()
                    return
                with self.lock:
                    self.cond.wait(max(0.01, _retry_at - time.monotonic()))
                continue
            try:
                send(item.frame())
                return
            except BlockingIOError:
                _wait_writable(0.05)
            except OSError as exc:
                if exc.errno not in _PEER_GONE:
                    item.drop()
                    return
                _send_failed(send, exc, None)


_outbox = _Outbox()


def _reset(forked: bool = False) -> None:
    """Forget the connection, counters and queue; the next call reads `HANGWATCH_SOCKET` again.

    Runs in a forked child (`forked`: its messages carry its own pid and seq from 1, and the parent's locks and
    drain thread are not touched because they may be mid-use by threads that do not exist here) and in tests.
    """
    global _send, _beat_prefix, _beat_format, _beat_no_step, _seq_counter, _next_seq, _mode, _path, _sock
    global _header_tail, _local_rank
    global _retry_at, _conn_lock, _stats_lock, _dropped, _warned, _outbox
    global _slot, _slot_map, _slot_count, _slot_forked, _slot_fd, _slot_tried, _slot_state, _slot_lock
    old_sock, old_outbox = _sock, _outbox
    _send = None
    # The mapping stays with the parent's pages; a child only forgets it (never unmaps what the parent uses) and
    # closes its copies of the descriptor, so that the slot's lock stays with the parent alone.
    _slot = None
    _slot_map = None
    _slot_count = 0
    if _slot_fd >= 0:
        try:
            os.close(_slot_fd)
        except OSError:
            pass
    _slot_fd = -1
    _slot_tried = False
    _slot_state = "untried"
    _slot_lock = threading.Lock()
    if forked:
        _slot_forked = True
    _conn_lock = threading.Lock()
    _stats_lock = threading.Lock()
    _outbox = _Outbox()
    _beat_prefix = b""
    _beat_format = b""
    _beat_no_step = b""
    _seq_counter = itertools.count(1)
    _next_seq = _seq_counter.__next__
    _mode = _UNINIT
    _path = None
    _sock = None
    _header_tail = b""
    _local_rank = b"-"
    _retry_at = 0.0
    _dropped = {"hello": 0, "beat": 0, "phase": 0, "log": 0}
    _warned = set()
    if not forked:
        old_outbox.close()
    if old_sock is not None:
        try:
            old_sock.close()
        except OSError:
            pass


def _after_fork_in_child() -> None:
    _reset(forked=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
