"""LoggingHandler: every record reaches the agent in order, even while it reads slowly; the caller never waits."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import hangwatch
from conftest import read_until_sent, within
from hangwatch import _client


@pytest.fixture
def log():
    logger = logging.getLogger("hw-test")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = hangwatch.LoggingHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    yield logger
    logger.removeHandler(handler)


def logs(msgs):
    return [m for m in msgs if m.type == "log"]


def test_record_format(agent, log):
    log.info("hello %s", "world")
    try:
        raise RuntimeError("bad")
    except RuntimeError:
        log.exception("failed")
    first, second = logs(agent.drain())
    assert (first.fields, first.body) == (["20"], "INFO hello world")
    assert second.fields == ["40"]
    assert second.body.startswith("ERROR failed\nTraceback")
    assert second.body.rstrip().endswith("RuntimeError: bad")


def test_default_format_has_time_level_and_logger(agent):
    logger = logging.getLogger("hw-test-default")
    logger.propagate = False
    handler = hangwatch.LoggingHandler()
    logger.addHandler(handler)
    try:
        logger.warning("x")
    finally:
        logger.removeHandler(handler)
    (msg,) = logs(agent.drain())
    assert msg.body.endswith(" WARNING hw-test-default: x")


def test_long_record_is_cut_at_the_limit_on_a_character_boundary(agent, log):
    log.info("é" * 40_000)
    raw = agent.recv_raw()
    raw = agent.recv_raw() if raw.startswith(b"hw1 hello") else raw
    assert len(raw) <= _client.MAX_MESSAGE_BYTES
    text = raw.decode("utf-8")
    body = text.split("\n", 1)[1]
    cut = 2 * 40_000 + len("INFO ") - len(body.rsplit(" [truncated", 1)[0].encode())
    assert body.endswith(" [truncated %d bytes]" % cut)


def test_every_record_arrives_in_order_while_the_agent_reads_slowly(agent, log):
    n = 2000
    received = []

    def slow_agent():
        while len(received) < n:
            try:
                msg = agent.recv(10.0)
            except OSError:
                return
            if msg.type == "log":
                received.append(msg.body)
            if len(received) % 20 == 0:
                time.sleep(0.01)

    reader = threading.Thread(target=slow_agent, daemon=True)
    reader.start()
    durations = []

    def produce():
        for i in range(n):
            t0 = time.perf_counter()
            log.info("record %d", i)
            durations.append(time.perf_counter() - t0)

    within(30, produce)
    produced_in = sum(durations)
    reader.join(30)
    assert received == ["INFO record %d" % i for i in range(n)]
    s = hangwatch.stats()
    assert s["dropped"] == 0 and s["queued"] == 0
    assert max(durations) < 0.5
    assert produced_in < 1.0, "logging waited for the agent: %.2f s" % produced_in


def test_order_holds_across_direct_queued_and_direct_again(agent, log):
    log.info("direct 0")
    log.info("direct 1")
    assert [m.body for m in logs(agent.drain(0.1))] == ["INFO direct 0", "INFO direct 1"]

    within(10, lambda: [log.info("stalled %d", i) for i in range(100)])
    assert hangwatch.stats()["queued"] > 0, "the agent did not read, so records must be waiting"

    bodies = [m.body for m in logs(read_until_sent(agent))]
    log.info("direct again")
    bodies += [m.body for m in logs(agent.drain(0.2))]
    assert bodies == ["INFO stalled %d" % i for i in range(100)] + ["INFO direct again"]


def test_queue_overflow_drops_new_records_counts_and_warns_once(agent, log, monkeypatch, capsys):
    monkeypatch.setattr(_client, "QUEUE_MAX_MESSAGES", 50)
    within(10, lambda: [log.info("r %d", i) for i in range(300)])
    s = hangwatch.stats()
    assert s["dropped_by_type"]["log"] > 0
    assert s["sent"] + s["queued"] + s["dropped"] == 301
    assert capsys.readouterr().err.count("new log/phase messages are dropped") == 1

    bodies = [m.body for m in logs(read_until_sent(agent))]
    numbers = [int(b.rsplit(" ", 1)[1]) for b in bodies]
    assert numbers == sorted(set(numbers)), "what is delivered keeps its order"
    assert numbers[:10] == list(range(10)), "the oldest were kept, newer ones dropped"
    assert len(numbers) == 300 - s["dropped_by_type"]["log"], "every record is delivered or counted as dropped"


def test_flush_waits_for_the_queue_but_not_forever(agent, log):
    within(10, lambda: [log.info("r %d", i) for i in range(100)])
    assert hangwatch.stats()["queued"] > 0
    t0 = time.monotonic()
    assert hangwatch.flush(0.2) is False
    assert time.monotonic() - t0 < 1.0

    reader = threading.Thread(target=lambda: agent.drain(0.5), daemon=True)
    reader.start()
    assert hangwatch.flush(5.0) is True
    reader.join()


def test_records_from_many_threads_all_arrive(agent, log):
    def worker(k):
        for i in range(100):
            log.info("t%d %d", k, i)

    received = []
    reader = threading.Thread(target=lambda: received.extend(agent.drain(0.5)), daemon=True)
    reader.start()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hangwatch.flush(10)
    reader.join(10)
    bodies = [m.body for m in logs(received)]
    assert sorted(bodies) == sorted("INFO t%d %d" % (k, i) for k in range(4) for i in range(100))
    for k in range(4):
        mine = [b for b in bodies if b.startswith("INFO t%d " % k)]
        assert mine == ["INFO t%d %d" % (k, i) for i in range(100)]
