"""The rank's answer to the agent's request for its Flight Recorder (_flight.py): the dump trimmed to what the
analysis reads, the request and answer over a real socket, and (with torch) a real gloo process group's recorder."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import threading

import pytest

from hangwatch import _client, _flight

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "crates/diagnosis/tests/fixtures/flight_recorder"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_a_real_dump_keeps_each_groups_progress_and_last_collectives():
    raw = (FIXTURES / "subgroup" / "rank0.json").read_bytes()
    out = json.loads(_flight.trimmed(raw, keep=2))
    assert out["pg_status"] == json.loads(raw)["pg_status"]
    by_group = {}
    for e in out["entries"]:
        by_group.setdefault(e["process_group"][0], []).append(e["collective_seq_id"])
    # The last two of each group, oldest first; only the fields the analysis reads.
    assert by_group == {"0": [5, 6], "1": [2, 3]}
    assert set(out["entries"][0]) == {
        "collective_seq_id",
        "profiling_name",
        "input_sizes",
        "input_dtypes",
        "state",
        "is_p2p",
        "process_group",
    }
    assert len(_flight.trimmed(raw)) < len(raw)
    assert _flight.trimmed(b"not json") is None


def test_the_recorder_counts_as_on_only_with_a_buffer(monkeypatch):
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert not _flight.recording()
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert not _flight.recording()
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    assert _flight.recording()


def test_the_agent_asks_and_the_rank_answers_with_its_record(agent, monkeypatch):
    monkeypatch.setattr(_flight, "dump", lambda: b'{"pg_status":{}}')
    assert _client._connect_if_due()
    assert agent.recv().type == "hello"
    stop = threading.Event()
    server = threading.Thread(target=_flight.serve, args=(stop,), daemon=True)
    server.start()
    # The thread says it answers, from the address the agent is to answer to.
    agent.sock.settimeout(2.0)
    listen, client_address = agent.sock.recvfrom(70_000)
    assert listen.split(b" ")[1] == b"listen" and listen.endswith(b" collectives"), listen
    assert client_address, "the client's socket has an address the agent can answer to"
    agent.sock.sendto(b"hw1 dump-collectives 7", client_address)
    answer = agent.recv(5.0)
    assert answer.type == "collectives"
    assert answer.fields == ["7"]
    assert answer.body == '{"pg_status":{}}'
    # Nothing but the agent reaches the client's socket.
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(PermissionError):
        stranger.sendto(b"hw1 dump-collectives 8", client_address)
    stranger.close()
    stop.set()
    server.join(timeout=10)
    assert not server.is_alive()


def test_what_is_not_a_request_is_not_answered(agent):
    assert not _flight.answer(b"hw1 dump-collectives x")
    assert not _flight.answer(b"hello")


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_a_real_gloo_group_dumps_its_collectives(monkeypatch, tmp_path):
    import torch
    import torch.distributed as dist

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(10))
        dist.barrier()
        out = json.loads(_flight.dump())
    finally:
        dist.destroy_process_group()
    ops = [(e["collective_seq_id"], e["profiling_name"]) for e in out["entries"]]
    assert ops[-4:] == [(1, "gloo:all_reduce"), (2, "gloo:all_reduce"), (3, "gloo:all_reduce"), (4, "gloo:barrier")]
    assert [s["last_enqueued_collective"] for s in out["pg_status"].values()] == ["4"]
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "64"
