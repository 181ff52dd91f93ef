"""What the agent receives for beats, phases and hello: fields, order and seq numbers as wire-protocol.md says."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

import hangwatch
from conftest import child_env, parse, read_until_sent


def test_first_message_is_hello_then_beats_in_order(agent):
    hangwatch.beat(7)
    hangwatch.beat()
    hello, first, second = agent.recv(), agent.recv(), agent.recv()
    assert (hello.tag, hello.type, hello.rank, hello.pid, hello.seq) == ("hw1", "hello", "3", os.getpid(), 1)
    assert hello.fields == ["1", hangwatch.__version__]
    assert (first.type, first.seq, first.fields) == ("beat", 2, ["7"])
    assert (second.type, second.seq, second.fields) == ("beat", 3, ["-"])
    assert hangwatch.stats()["sent"] == 3


def test_unknown_rank_is_a_dash(agent, monkeypatch):
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("LOCAL_RANK", "not a number")
    hangwatch.beat(1)
    hello, beat = agent.recv(), agent.recv()
    assert hello.rank == "-" and hello.fields[0] == "-"
    assert beat.rank == "-"


def test_steps_that_are_not_ints_never_raise(agent):
    class Index:
        def __index__(self):
            return 11

    hangwatch.beat(3.9)
    hangwatch.beat(Index())
    hangwatch.beat("12")
    hangwatch.beat("twelve")
    hangwatch.beat(object())
    got = [m.fields[0] for m in agent.drain() if m.type == "beat"]
    assert got == ["3", "11", "12", "-", "-"]


def test_phases_nest_and_arrive_in_order(agent):
    with hangwatch.phase("checkpoint"):
        hangwatch.beat(1)
        with hangwatch.phase("write shard 0"):
            pass
    msgs = [m for m in agent.drain() if m.type != "hello"]
    assert [(m.type, m.fields) for m in msgs] == [
        ("phase", ["begin", "checkpoint"]),
        ("beat", ["1"]),
        ("phase", ["begin", "write shard 0"]),
        ("phase", ["end", "write shard 0"]),
        ("phase", ["end", "checkpoint"]),
    ]
    assert [m.seq for m in msgs] == sorted(m.seq for m in msgs)


def test_phase_as_decorator_ends_even_when_the_function_raises(agent):
    @hangwatch.phase("eval")
    def evaluate(fail):
        if fail:
            raise ValueError("boom")
        return 42

    assert evaluate(False) == 42
    with pytest.raises(ValueError, match="boom"):
        evaluate(True)
    phases = [m.fields for m in agent.drain() if m.type == "phase"]
    assert phases == [["begin", "eval"], ["end", "eval"]] * 2


def test_evaluation_is_the_phase_named_evaluation_as_context_manager_and_decorator(agent):
    from hangwatch.integrations._phases import EVALUATION

    assert EVALUATION == "evaluation"

    @hangwatch.evaluation()
    def validate(fail):
        hangwatch.beat()
        if fail:
            raise ValueError("boom")

    with hangwatch.evaluation():
        hangwatch.beat()
    validate(False)
    with pytest.raises(ValueError, match="boom"):
        validate(True)
    with hangwatch.phase("evaluation"):
        pass
    msgs = [m for m in agent.drain() if m.type != "hello"]
    once = [("phase", ["begin", "evaluation"]), ("beat", ["-"]), ("phase", ["end", "evaluation"])]
    assert [(m.type, m.fields) for m in msgs] == once * 3 + [once[0], once[2]]
    raw = [m.raw.split(b" ", 5)[5] for m in msgs if m.type == "phase"]
    assert raw == [b"begin evaluation", b"end evaluation"] * 4


def test_phase_name_with_newline_stays_one_line(agent):
    with hangwatch.phase("a\nb"):
        pass
    phases = [m for m in agent.drain() if m.type == "phase"]
    assert phases[0].fields == ["begin", "a b"] and phases[0].body is None


def test_seq_is_unique_across_threads(agent):
    def worker():
        for i in range(200):
            hangwatch.beat(i)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    msgs = agent.drain()
    dropped = hangwatch.stats()["dropped"]
    seqs = [m.seq for m in msgs]
    assert len(seqs) == len(set(seqs))
    assert len(msgs) + dropped == 801
    assert max(seqs) <= 801


def test_import_pulls_in_no_framework():
    code = (
        "import sys, hangwatch, hangwatch.integrations; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'lightning', 'pytorch_lightning', 'accelerate', 'numpy')]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env())
    assert out.stdout.strip() == "[]"


def test_parse_helper_keeps_log_body():
    msg = parse(b"hw1 log 0 12 5 20\nline one\nline two")
    assert (msg.type, msg.fields, msg.body) == ("log", ["20"], "line one\nline two")


def test_abstract_socket_name(monkeypatch):
    name = "hw-test-%d" % os.getpid()
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(2)
    try:
        monkeypatch.setenv("HANGWATCH_SOCKET", "@" + name)
        hangwatch.beat(9)
        assert parse(receiver.recv(1000)).type == "hello"
        assert parse(receiver.recv(1000)).fields == ["9"]
    finally:
        receiver.close()


def test_a_rank_report_says_rank_local_rank_and_world_size_once(agent):
    from hangwatch import _rank

    _rank._after_fork_in_child()
    assert hangwatch.report_rank(2, 0, 4)
    assert not hangwatch.report_rank(2, 0, 4)
    assert not hangwatch.report_rank(-1)
    reports = [m for m in read_until_sent(agent) if m.type == "rank"]
    assert len(reports) == 1
    assert (reports[0].rank, reports[0].fields) == ("3", ["2", "0", "4", "torch"])


def test_the_rank_torch_distributed_knows_is_reported_once_it_is_initialized(agent, monkeypatch):
    import types

    from hangwatch import _rank

    _rank._after_fork_in_child()
    dist = types.ModuleType("torch.distributed")
    state = {"initialized": False}
    dist.is_available = lambda: True
    dist.is_initialized = lambda: state["initialized"]
    dist.get_rank = lambda: 1
    dist.get_world_size = lambda: 4
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not _rank.report_from_torch()
    state["initialized"] = True
    assert _rank.report_from_torch()
    reports = [m for m in read_until_sent(agent) if m.type == "rank"]
    assert [m.fields for m in reports] == [["1", "1", "4", "torch"]]
