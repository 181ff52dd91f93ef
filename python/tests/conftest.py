"""Test kit: a real Unix datagram socket playing the agent, a protocol parser, and client state reset per test."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import pytest

from hangwatch import _client


@dataclass
class Message:
    """One datagram parsed the way the agent parses hw1 (docs/wire-protocol.md)."""

    tag: str
    type: str
    rank: str
    pid: int
    seq: int
    fields: List[str]
    body: Optional[str]
    raw: bytes


def parse(data: bytes) -> Message:
    text = data.decode("utf-8")
    first, _, body = text.partition("\n")
    parts = first.split(" ")
    if parts[1] == "phase":
        fields = [parts[5], " ".join(parts[6:])]
    else:
        fields = parts[5:]
    body_or_none = body if "\n" in text else None
    return Message(parts[0], parts[1], parts[2], int(parts[3]), int(parts[4]), fields, body_or_none, data)


class Agent:
    """The agent's end: a bound datagram socket the test reads when it wants to (or never)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)

    def recv(self, timeout: float = 2.0) -> Message:
        self.sock.settimeout(timeout)
        return parse(self.sock.recv(70_000))

    def recv_raw(self, timeout: float = 2.0) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(70_000)

    def take(self) -> List[Message]:
        """Everything delivered so far, without waiting. A send to a Unix datagram socket has queued its datagram by
        the time it returns, so a test that takes after each framework event never lets the socket's queue of ~11
        datagrams fill, and every beat arrives."""
        self.sock.setblocking(False)
        out = []
        while True:
            try:
                out.append(parse(self.sock.recv(70_000)))
            except BlockingIOError:
                return out

    def drain(self, quiet: float = 0.2) -> List[Message]:
        """Everything that arrives until nothing has come for `quiet` seconds."""
        out = []
        while True:
            try:
                out.append(self.recv(quiet))
            except socket.timeout:
                return out

    def recv_until(self, pred: Callable[[Message], bool], timeout: float = 5.0) -> List[Message]:
        """Messages up to and including the first that satisfies `pred`."""
        deadline = time.monotonic() + timeout
        out = []
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "timed out; got %r" % [m.raw for m in out]
            msg = self.recv(left)
            out.append(msg)
            if pred(msg):
                return out

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@pytest.fixture
def sockdir():
    """A short directory path: AF_UNIX paths are limited to 107 bytes and pytest's tmp_path can be longer."""
    path = tempfile.mkdtemp(prefix="hw-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_client(monkeypatch):
    """Each test starts as a new process would: no connection, seq from 1, environment read on first use."""
    monkeypatch.delenv(_client.ENV_SOCKET, raising=False)
    monkeypatch.delenv(_client.ENV_BEATS, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    _client._reset()
    yield
    _client._reset()


@pytest.fixture
def one_process(monkeypatch):
    """No RANK/LOCAL_RANK/WORLD_SIZE: with torch installed, transformers, accelerate and Lightning take the test kit's
    RANK for a distributed launch and try to join a process group."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def agent(sockdir, monkeypatch):
    a = Agent(os.path.join(sockdir, "agent.sock"))
    monkeypatch.setenv(_client.ENV_SOCKET, a.path)
    yield a
    a.close()


def within(seconds: float, fn: Callable[[], None]) -> None:
    """Run `fn` in a thread and fail (instead of hanging the suite) when it has not returned in time."""
    errors: List[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "did not return within %.1f s: the client blocked" % seconds
    if errors:
        raise errors[0]


def read_until_sent(agent: Agent, timeout: float = 10.0) -> List[Message]:
    """Read as the agent would until the client has nothing queued, then a little longer for the last datagrams."""
    from hangwatch import stats

    deadline = time.monotonic() + timeout
    out: List[Message] = []
    while stats()["queued"]:
        assert time.monotonic() < deadline, "the client still has %d queued" % stats()["queued"]
        out += agent.drain(0.05)
    return out + agent.drain(0.1)


def child_env() -> dict:
    """The environment for a child Python that must import this checkout's hangwatch, installed or not."""
    import hangwatch

    src = os.path.dirname(os.path.dirname(os.path.abspath(hangwatch.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env
