"""Without an agent every call is a no-op or a counted drop: nothing raises, nothing blocks."""

from __future__ import annotations

import logging
import os
import socket
import time

import hangwatch
from conftest import Agent, within
from hangwatch import _client


def test_without_variable_everything_is_a_noop(capsys):
    def calls():
        hangwatch.beat(1)
        hangwatch.beat()
        with hangwatch.phase("checkpoint"):
            pass

    within(5, calls)
    s = hangwatch.stats()
    assert s["enabled"] is False and s["sent"] == 0 and s["dropped"] == 0
    assert capsys.readouterr().err == ""


def test_without_variable_log_records_go_to_stderr_by_default(capsys):
    log = logging.getLogger("hw-test-fallback")
    handler = hangwatch.LoggingHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        log.warning("disk %s full", "/x")
    finally:
        log.removeHandler(handler)
    assert capsys.readouterr().err == "WARNING disk /x full\n"


def test_without_variable_log_records_go_to_the_fallback_handler():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("hw-test-fallback2")
    log.addHandler(hangwatch.LoggingHandler(fallback=Keep()))
    log.addHandler(hangwatch.LoggingHandler(fallback=None))
    log.error("one")
    assert seen == ["one"]


def test_path_nobody_listens_on_drops_counts_and_warns_once(sockdir, monkeypatch, capsys):
    monkeypatch.setenv(_client.ENV_SOCKET, os.path.join(sockdir, "nobody.sock"))

    def calls():
        for i in range(100):
            hangwatch.beat(i)

    within(5, calls)
    s = hangwatch.stats()
    assert s["enabled"] is True and s["connected"] is False
    assert s["dropped_by_type"]["beat"] == 100 and s["sent"] == 0
    err = capsys.readouterr().err
    assert err.count("hangwatch: cannot reach the agent") == 1


def test_an_agent_that_comes_later_is_waited_for_quietly_and_then_reached(sockdir, monkeypatch, capsys):
    """A node service's TaskProlog exports the socket before the step's watcher binds it."""
    path = os.path.join(sockdir, "later.sock")
    monkeypatch.setenv(_client.ENV_SOCKET, path)
    monkeypatch.setenv("HANGWATCH_AGENT_LATER", "1")
    monkeypatch.setattr(_client, "RECONNECT_INTERVAL_S", 0.05)
    hangwatch.beat(1)
    assert hangwatch.stats()["dropped_by_type"]["beat"] == 1
    agent = Agent(path)
    try:
        deadline = time.monotonic() + 5
        while not hangwatch.stats()["connected"] and time.monotonic() < deadline:
            hangwatch.beat(2)
            time.sleep(0.06)
        assert hangwatch.stats()["connected"] is True
        assert "beat" in [m.type for m in agent.drain(0.2)]
    finally:
        agent.close()
    assert "cannot reach the agent" not in capsys.readouterr().err


def test_socket_file_without_reader_refuses_and_drops(sockdir, monkeypatch, capsys):
    path = os.path.join(sockdir, "stale.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(path)
    stale.close()
    monkeypatch.setenv(_client.ENV_SOCKET, path)

    def calls():
        for i in range(10):
            hangwatch.beat(i)
        with hangwatch.phase("x"):
            pass

    within(5, calls)
    s = hangwatch.stats()
    assert s["dropped_by_type"]["beat"] == 10
    assert s["sent"] == 0
    assert "hangwatch: cannot reach the agent" in capsys.readouterr().err


def test_agent_restart_is_picked_up(agent, monkeypatch):
    monkeypatch.setattr(_client, "RECONNECT_INTERVAL_S", 0.05)
    hangwatch.beat(1)
    assert [m.type for m in agent.drain(0.1)] == ["hello", "beat"]
    path = agent.path
    agent.close()
    hangwatch.beat(2)
    assert hangwatch.stats()["dropped_by_type"]["beat"] == 1
    from conftest import Agent

    again = Agent(path)
    try:
        import time

        deadline = time.monotonic() + 5
        got = []
        while time.monotonic() < deadline and not any(m.type == "beat" for m in got):
            hangwatch.beat(3)
            time.sleep(0.02)
            got += again.drain(0.01)
        assert got[0].type == "hello"
        beats = [m for m in got if m.type == "beat"]
        assert beats[0].fields == ["3"]
        assert beats[0].seq > 3, "seq keeps counting so the agent sees the gap"
    finally:
        again.close()
