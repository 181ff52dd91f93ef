"""Process lifecycle: a forked child speaks with its own pid and seq; exit delivers queued records but never hangs."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import pytest

import hangwatch
from conftest import child_env, within


def wait_child(pid: int, seconds: float) -> int:
    """Exit status of our forked child; kill it (by its pid) when it overstays, so no test leaves a process behind."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("forked child did not finish in %.0f s" % seconds)


def fork_and_run(body) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    return pid


def test_forked_child_has_its_own_pid_seq_and_hello(agent):
    hangwatch.beat(1)

    def child():
        hangwatch.beat(100)
        with hangwatch.phase("child work"):
            pass

    pid = fork_and_run(child)
    assert wait_child(pid, 10) == 0
    hangwatch.beat(2)
    msgs = agent.drain()
    mine = [(m.type, m.seq, m.fields) for m in msgs if m.pid == os.getpid()]
    theirs = [(m.type, m.seq, m.fields) for m in msgs if m.pid == pid]
    assert mine == [("hello", 1, ["1", hangwatch.__version__]), ("beat", 2, ["1"]), ("beat", 3, ["2"])]
    assert theirs == [
        ("hello", 1, ["1", hangwatch.__version__]),
        ("beat", 2, ["100"]),
        ("phase", 3, ["begin", "child work"]),
        ("phase", 4, ["end", "child work"]),
    ]
    assert all(m.rank == "3" for m in msgs)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_records_queued_in_the_parent_are_not_sent_again_by_the_child(agent):
    log = logging.getLogger("hw-fork")
    log.propagate = False
    handler = hangwatch.LoggingHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    try:
        within(10, lambda: [log.warning("parent %d", i) for i in range(30)])
        assert hangwatch.stats()["queued"] > 0

        def child():
            log.warning("child 0")
            assert hangwatch.stats()["queued"] <= 2, "only its own hello and record, none of the parent's"
            assert hangwatch.flush(10)

        pid = fork_and_run(child)
        received = []
        stop = threading.Event()

        def read():
            while not stop.is_set():
                try:
                    received.append(agent.recv(0.1))
                except socket.timeout:
                    pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert wait_child(pid, 15) == 0
            assert hangwatch.flush(10)
        finally:
            stop.set()
            reader.join(15)
    finally:
        log.removeHandler(handler)
    parent = [m.body for m in received if m.type == "log" and m.pid == os.getpid()]
    child = [m.body for m in received if m.type == "log" and m.pid == pid]
    assert parent == ["parent %d" % i for i in range(30)]
    assert child == ["child 0"]


EXIT_SCRIPT = textwrap.dedent(
    """
    import logging, sys, hangwatch
    log = logging.getLogger()
    log.addHandler(hangwatch.LoggingHandler())
    log.setLevel(logging.INFO)
    for i in range(200):
        log.info("r %d", i)
    sys.stdout.write("queued %d\\n" % hangwatch.stats()["queued"])
    sys.stdout.flush()
    """
)


def test_exit_delivers_queued_records(agent):
    proc = subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        queued_line = proc.stdout.readline()
        msgs = agent.drain(0.5)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert int(queued_line.split()[1]) > 0, "the agent was not reading, so records were queued at exit"
    assert [m.body.rsplit(" ", 2)[-2:] for m in msgs if m.type == "log"] == [["r", str(i)] for i in range(200)]


def test_exit_is_bounded_when_the_agent_never_reads(agent):
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=30, env=child_env()
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0
    assert int(proc.stdout.split()[1]) > 0
    assert elapsed < 10, "exit took %.1f s; the flush at exit waits at most flush_timeout (2 s)" % elapsed
