"""An agent that stops reading never stalls the caller: beats are dropped and counted, the seq gap shows them."""

from __future__ import annotations

import logging
import time

import hangwatch
from conftest import read_until_sent, within


def test_beats_never_block_when_the_agent_stops_reading(agent):
    n = 20_000
    durations = []

    def flood():
        clock = time.perf_counter
        for i in range(n):
            t0 = clock()
            hangwatch.beat(i)
            durations.append(clock() - t0)

    within(60, flood)
    s = hangwatch.stats()
    assert s["dropped_by_type"]["beat"] > n // 2, "the socket buffer holds only a few datagrams"
    assert s["sent"] + s["dropped"] + s["queued"] == n + 1
    assert max(durations) < 0.5, "a call took %.3f s" % max(durations)
    durations.sort()
    assert durations[len(durations) // 2] < 0.001

    received = agent.drain()
    beats = [m for m in received if m.type == "beat"]
    assert len(received) == s["sent"]
    assert [m.fields[0] for m in beats] == sorted((m.fields[0] for m in beats), key=int)
    hangwatch.beat(n)
    after = agent.recv()
    assert after.seq - (len(received) + 1) == s["dropped"], "the next message's seq tells the agent how many were lost"


def test_beats_flow_again_once_the_agent_reads(agent):
    within(30, lambda: [hangwatch.beat(i) for i in range(1000)])
    agent.drain(0.1)
    dropped_before = hangwatch.stats()["dropped"]
    hangwatch.beat(5000)
    last = agent.recv(1.0)
    assert (last.type, last.fields) == ("beat", ["5000"])
    assert hangwatch.stats()["dropped"] == dropped_before


def test_phases_wait_in_order_while_beats_are_dropped(agent):
    def work():
        for i in range(200):
            hangwatch.beat(i)
            if i % 50 == 0:
                with hangwatch.phase("p%d" % i):
                    pass

    within(30, work)
    s = hangwatch.stats()
    assert s["dropped_by_type"]["phase"] == 0
    msgs = read_until_sent(agent)
    phases = [m.fields for m in msgs if m.type == "phase"]
    expected = []
    for i in range(0, 200, 50):
        expected += [["begin", "p%d" % i], ["end", "p%d" % i]]
    assert phases == expected


def test_seq_gaps_at_the_agent_match_the_clients_drop_count(agent):
    """The agent counts a rank's losses from gaps between consecutive seqs of a pid (crates/agent heartbeat.rs);
    that only works if datagrams arrive in seq order, queued ones included."""
    log = logging.getLogger("hw-gaps")
    log.propagate = False
    log.addHandler(hangwatch.LoggingHandler())

    def stalled_agent():
        for i in range(300):
            hangwatch.beat(i)
            if i % 10 == 0:
                log.warning("record %d", i)
            if i % 100 == 0:
                with hangwatch.phase("p"):
                    pass

    try:
        within(30, stalled_agent)
        received = read_until_sent(agent)
        hangwatch.beat(1000)
        received += agent.drain(0.1)
    finally:
        log.handlers.clear()
    seqs = [m.seq for m in received]
    assert seqs == sorted(seqs)
    gaps = sum(b - a - 1 for a, b in zip(seqs, seqs[1:]))
    s = hangwatch.stats()
    assert gaps == s["dropped"] > 0
    assert s["dropped_by_type"]["log"] == s["dropped_by_type"]["phase"] == 0
    assert len([m for m in received if m.type == "log"]) == 30
