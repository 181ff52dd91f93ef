"""A real torch job (gloo, CPU) with a silent phase, for the tests of what hangwatch must not take for a hang
(docs/false-alarms.md). Run under `hangwatch run --nproc N`, which gives it RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.

Each rank trains: a line per step and an all_reduce per step. Then, by --mode:
  eval      every rank evaluates for --silence seconds without printing (a validation loop with no logging:
            forward passes under torch.no_grad()), then trains on and exits 0;
  prepare   rank 0 alone computes for --silence seconds (building an index) while its peers wait in an all_reduce,
            then all train on and exit 0;
  spin      every rank spins forever at the same place (a loop that never ends), printing nothing;
  stop      every rank evaluates for --silence seconds, then rank 0 sleeps forever (a deadlock of its own) while its
            peers wait for it in all_reduce: the work stopped, and so must the job;
  download  rank 0 fetches --url whole into a local file (a dataset shard from a slow mirror: urllib, no timeout, as
            most clients default to) while its peers wait in all_reduce, then all train on and exit 0;
  child-copy
            rank 0 has a child process copy --src (a file on a slow mount) at --rate bytes per second into a local
            file, as `cp`, `aws s3 cp` or `git lfs` would, and waits for it while its peers wait in all_reduce;
            then all train on and exit 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def train(model, opt, steps, rank, first_step):
    for step in range(first_step, first_step + steps):
        x = torch.randn(64, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    return first_step + steps


def evaluate(model, seconds):
    """A validation pass that logs nothing: forward passes until the time is up."""
    model.eval()
    end = time.monotonic() + seconds
    batches = 0
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randn(256, 32)).sum()
            batches += 1
    model.train()
    return batches


def prepare_index(seconds):
    """Rank 0 builds something its peers need (an index, a tokenizer cache): pure computation."""
    end = time.monotonic() + seconds
    table = torch.randn(512, 512)
    while time.monotonic() < end:
        table = torch.tanh(table @ table.T / 512.0)
    return table


def fetch_shard(url):
    """Rank 0 downloads what its peers need into a local file, as a hub or bucket client fills its cache: almost
    no CPU, bytes trickling in."""
    import tempfile
    import urllib.request

    got = 0
    with urllib.request.urlopen(url) as response, tempfile.TemporaryFile() as shard:
        while True:
            chunk = response.read(4096)
            if not chunk:
                return got
            shard.write(chunk)
            got += len(chunk)


# The child's program: a plain Python process (no torch), reading a page at a time with read-ahead off, so that each
# read is one request to the mount (on a slow FUSE mount it waits in the daemon's queue, as a copy from a loaded
# network filesystem does), paced to `rate` bytes per second.
COPY_CHILD = """
import os, sys, time
src, dst, rate = sys.argv[1], sys.argv[2], int(sys.argv[3])
start, got = time.monotonic(), 0
with open(src, "rb", buffering=0) as f, open(dst, "wb", buffering=0) as out:
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    while True:
        page = f.read(4096)
        if not page:
            break
        out.write(page)
        got += len(page)
        ahead = got / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
"""


def copy_from_mount(src, rate):
    """Rank 0 has a child copy what its peers need off a slow mount and waits for it: the child moves the bytes,
    rank 0 itself only waits."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as local:
        dst = os.path.join(local, "copy")
        subprocess.run([sys.executable, "-c", COPY_CHILD, src, dst, str(rate)], check=True)
        return os.path.getsize(dst)


def spin_forever():
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2147483648


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mode", choices=["eval", "prepare", "spin", "stop", "download", "child-copy"], required=True
    )
    parser.add_argument("--url", help="what rank 0 downloads in --mode download")
    parser.add_argument("--src", help="what rank 0's child copies in --mode child-copy")
    parser.add_argument("--rate", type=int, default=65536, help="bytes per second in --mode child-copy")
    parser.add_argument("--silence", type=float, default=150.0)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = train(model, opt, args.steps, rank, 0)

    if args.mode == "eval":
        evaluate(model, args.silence)
    elif args.mode == "prepare":
        if rank == 0:
            prepare_index(args.silence)
        dist.all_reduce(torch.zeros(1))
    elif args.mode == "download":
        if rank == 0:
            print(f"rank 0 fetched {fetch_shard(args.url)} bytes", flush=True)
        dist.all_reduce(torch.zeros(1))
    elif args.mode == "child-copy":
        if rank == 0:
            print(f"rank 0 copied {copy_from_mount(args.src, args.rate)} bytes", flush=True)
        dist.all_reduce(torch.zeros(1))
    elif args.mode == "stop":
        evaluate(model, args.silence)
        if rank == 0:
            while True:
                time.sleep(3600)
        dist.all_reduce(torch.zeros(1))
    else:
        spin_forever()

    train(model, opt, 3, rank, step)
    print(f"rank {rank} done (pid {os.getpid()})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
