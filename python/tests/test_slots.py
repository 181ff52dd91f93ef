"""Beats through the shared-memory slots (HANGWATCH_BEATS): one store into this rank's slot, no datagram; a worker
(forked, spawned or started by a forkserver) never writes its rank's slot nor sends beats; a process that is not a
descendant of the slot's owner beats by datagram; a restarted rank takes the slot again and its count goes on; a
file that cannot serve the rank leaves beats on datagrams."""

from __future__ import annotations

import logging
import multiprocessing
import os
import struct
import subprocess
import sys
import textwrap

import pytest

import hangwatch
from hangwatch import _client
from conftest import child_env
from test_process import fork_and_run, wait_child


@pytest.fixture
def slots(sockdir, monkeypatch):
    path = os.path.join(sockdir, "beats")
    with open(path, "wb") as f:
        f.truncate(_client.SLOT_BYTES * 8)
    monkeypatch.setenv(_client.ENV_BEATS, path)
    return path


def slot(path: str, index: int):
    """(count, step, pid, rank + 1) as the agent reads them."""
    with open(path, "rb") as f:
        f.seek(index * _client.SLOT_BYTES)
        return struct.unpack("<QqQQ", f.read(32))


def test_beats_go_into_the_slot_of_the_local_rank_without_a_datagram(agent, slots):
    hangwatch.beat(7)
    assert slot(slots, 1) == (1, 7, os.getpid(), 4), "LOCAL_RANK 1's slot, with its pid and RANK 3"
    hangwatch.beat()
    assert slot(slots, 1)[:2] == (2, -1)
    hangwatch.beat("8")
    assert slot(slots, 1)[:2] == (3, 8), "a step given as text that is a number"
    hangwatch.beat(2**70)
    assert slot(slots, 1)[:2] == (4, -1), "a step too large for the slot is no step, not an error"
    hangwatch.beat(object())
    assert slot(slots, 1)[:2] == (5, -1)
    assert slot(slots, 0) == (0, 0, 0, 0), "other slots untouched"
    assert [m.type for m in agent.drain()] == ["hello"], "only the hello went by datagram"
    assert hangwatch.stats()["beats_in_slot"] == 5


def test_a_forked_child_never_beats_in_its_parents_slot_nor_by_datagram(agent, slots):
    hangwatch.beat(1)

    def child():
        hangwatch.beat(100)
        assert hangwatch.stats()["beat_slot"] == "worker"

    pid = fork_and_run(child)
    assert wait_child(pid, 10) == 0
    hangwatch.beat(2)
    assert slot(slots, 1)[:3] == (2, 2, os.getpid())
    theirs = [(m.type, m.fields) for m in agent.drain() if m.pid == pid]
    assert ("beat", ["100"]) not in theirs, "a worker is not a rank: its beats are not sent"


@pytest.fixture
def fresh_forkserver():
    """A forkserver keeps the environment it was started with (an earlier test's agent and slots): each test that
    uses one starts its own."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()
    yield
    if stop is not None:
        stop()


def _worker(results) -> None:
    """A DataLoader worker's life in short: it logs through the rank's handler and beats (as library code might),
    then says what its slot was to it."""
    log = logging.getLogger("hw-worker")
    log.propagate = False
    handler = hangwatch.LoggingHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.warning("worker %d here", os.getpid())
    hangwatch.beat(100)
    hangwatch.flush(5)
    results.put((os.getpid(), hangwatch.stats().get("beat_slot")))


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_worker_started_by_spawn_forkserver_or_fork_never_takes_its_ranks_slot(
    agent, slots, method, fresh_forkserver
):
    hangwatch.beat(1)
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(results,)) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        said = sorted(results.get(timeout=60) for _ in workers)
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
                w.join(5)
    hangwatch.beat(2)
    assert slot(slots, 1) == (2, 2, os.getpid(), 4), "the rank's slot, pid and count, whoever came and went"
    assert [state for _, state in said] == ["worker", "worker"], said
    msgs = agent.drain()
    worker_pids = {pid for pid, _ in said}
    assert not [m for m in msgs if m.pid in worker_pids and m.type == "beat"], "workers send no beats"
    logs = sorted(m.body for m in msgs if m.pid in worker_pids and m.type == "log")
    assert logs == sorted("worker %d here" % pid for pid in worker_pids), "their log records still arrive"


def _logging_worker(started, go) -> None:
    """A worker that logs (its client starts) but never beats, and stays until told to go."""
    log = logging.getLogger("hw-worker")
    log.propagate = False
    log.addHandler(hangwatch.LoggingHandler())
    log.warning("worker %d here", os.getpid())
    hangwatch.flush(5)
    started.set()
    go.wait(30)


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_worker_that_only_logs_before_its_ranks_first_beat_leaves_the_slot_to_the_rank(agent, slots, method):
    ctx = multiprocessing.get_context(method)
    started, go = ctx.Event(), ctx.Event()
    worker = ctx.Process(target=_logging_worker, args=(started, go))
    worker.start()
    try:
        assert started.wait(60), "the worker did not start"
        assert slot(slots, 1) == (0, 0, 0, 0), "logging takes no slot"
        hangwatch.beat(4)
        assert hangwatch.stats()["beat_slot"] == "owned"
        assert slot(slots, 1) == (1, 4, os.getpid(), 4)
    finally:
        go.set()
        worker.join(30)
        if worker.is_alive():
            worker.kill()
            worker.join(5)


class _LoggingDataset:
    """A map-style dataset whose items are made in the DataLoader's workers, each logging and beating there."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        log = logging.getLogger("hw-dataset")
        if not log.handlers:
            # A spawned worker re-imports the job's modules, whose top level installs the handler again.
            log.propagate = False
            log.addHandler(hangwatch.LoggingHandler())
        log.warning("item %d in %d", index, os.getpid())
        hangwatch.beat(1000 + index)
        return index


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_torch_dataloader_workers_never_take_the_ranks_slot(agent, slots, method, fresh_forkserver):
    torch_data = pytest.importorskip("torch.utils.data")
    log = logging.getLogger("hw-dataset")
    log.propagate = False
    handler = hangwatch.LoggingHandler()
    log.addHandler(handler)
    try:
        hangwatch.beat(1)
        for epoch in range(2):
            loader = torch_data.DataLoader(
                _LoggingDataset(), batch_size=2, num_workers=2, multiprocessing_context=method
            )
            assert sorted(int(x) for batch in loader for x in batch) == list(range(8))
            hangwatch.beat(2 + epoch)
            assert slot(slots, 1) == (2 + epoch, 2 + epoch, os.getpid(), 4), "epoch %d" % epoch
    finally:
        log.removeHandler(handler)
    # The socket holds a few datagrams and workers exit without flushing, so not every record is here; every beat
    # that is comes from this process.
    msgs = agent.drain()
    assert {m.pid for m in msgs if m.type == "beat"} <= {os.getpid()}, "workers send no beats"
    assert [m for m in msgs if m.pid != os.getpid() and m.type == "log"], "the workers' records arrive"


HOLDER = textwrap.dedent(
    """
    import sys, hangwatch
    hangwatch.beat(int(sys.argv[1]))
    print(hangwatch.stats()["beat_slot"], flush=True)
    sys.stdin.read()
    """
)


def test_a_process_that_is_not_a_descendant_of_the_owner_beats_by_datagram(agent, slots):
    """torch.multiprocessing.spawn's ranks have no LOCAL_RANK and share slot 0: the first to beat owns it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "5"], env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline().strip() == b"owned"
        hangwatch.beat(9)
        assert hangwatch.stats()["beat_slot"] == "other"
        assert slot(slots, 1)[:3] == (1, 5, holder.pid)
        beats = [m for m in agent.drain() if m.pid == os.getpid() and m.type == "beat"]
        assert [m.fields for m in beats] == [["9"]], "ours went by datagram"
    finally:
        holder.kill()
        holder.wait(10)


def test_a_restarted_rank_takes_the_slot_again_and_its_count_goes_on(agent, slots):
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "5"], env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert first.stdout.readline().strip() == b"owned"
    finally:
        first.kill()
        first.wait(10)
    hangwatch.beat(6)
    assert hangwatch.stats()["beat_slot"] == "owned"
    assert slot(slots, 1) == (2, 6, os.getpid(), 4), "the count went on from the first owner's"


def test_a_slot_the_file_cannot_hold_leaves_beats_on_datagrams(agent, sockdir, monkeypatch):
    path = os.path.join(sockdir, "small")
    with open(path, "wb") as f:
        f.truncate(_client.SLOT_BYTES)  # one slot: LOCAL_RANK 1 does not fit
    monkeypatch.setenv(_client.ENV_BEATS, path)
    hangwatch.beat(5)
    msgs = agent.drain()
    assert [m.type for m in msgs] == ["hello", "beat"]
    assert msgs[1].fields == ["5"]
    assert hangwatch.stats()["beats_in_slot"] == 0
