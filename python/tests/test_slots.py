"""Beats through the shared-memory slots (HANGWATCH_BEATS): one store into this rank's slot, no datagram; a forked
child never writes its parent's slot; a file that cannot serve the rank leaves beats on datagrams."""

from __future__ import annotations

import os
import struct

import pytest

import hangwatch
from hangwatch import _client
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


def test_a_forked_child_never_beats_in_its_parents_slot(agent, slots):
    hangwatch.beat(1)
    pid = fork_and_run(lambda: hangwatch.beat(100))
    assert wait_child(pid, 10) == 0
    assert slot(slots, 1)[:3] == (1, 1, os.getpid())
    theirs = [(m.type, m.fields) for m in agent.drain() if m.pid == pid]
    assert ("beat", ["100"]) in theirs, "the child's beat went by datagram, under its own pid"


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
