"""A torchrun-like job whose ranks use forked data-loader workers that exit every epoch, for hangwatch's tests.

    python3 worker_job.py launch --nproc N [RANK OPTIONS]   the launcher: starts N ranks with torchrun's
                                                            environment (RANK, LOCAL_RANK, WORLD_SIZE, ...)
    python3 worker_job.py rank [RANK OPTIONS]               one rank (what the launcher starts)

Each epoch a rank forks --workers `multiprocessing` workers (they inherit RANK, as DataLoader workers do); they
put one batch per step on a queue and exit at the end of the epoch. Each step the rank takes a batch, works,
optionally appends to its log, and waits in the TCP barrier of rank.py (whose helpers it reuses).

Misbehaviours, each for --only-rank R only:
  --log PATH              the rank appends a line per step (a frozen filesystem puts the rank in D in write())
  --worker-write PATH     its first worker appends 4 KiB per batch (a frozen filesystem puts the worker in D)
  --pause STEP:SECONDS    before step STEP the rank pauses (an eval), starting a short-lived worker every 0.3 s

Dependency-free on purpose. Every process exits by itself when the one that started it dies.
"""

import argparse
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rank as common  # noqa: E402  (rank.py: say, connect, barrier, serve_barrier, work, ...)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["launch", "rank"])
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (launch)")
    p.add_argument("--epochs", type=int, default=0, help="epochs to run, 0 = until killed")
    p.add_argument("--steps-per-epoch", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="forked workers per rank per epoch")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of computation per step")
    p.add_argument("--only-rank", type=int, default=0, help="the rank that --log, --worker-write, --pause apply to")
    p.add_argument("--log", help="file the rank appends a line to every step")
    p.add_argument("--worker-write", help="file the rank's first worker appends to every batch")
    p.add_argument("--pause", metavar="STEP:SECONDS", help="pause before global step STEP, churning workers")
    return p.parse_args(argv)


# ---- the launcher ----

def launch(args, rest):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for r in range(args.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        ranks.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "rank"] + rest, env=env))
    codes = [p.wait() for p in ranks]
    sys.exit(next((c for c in codes if c != 0), 0))


# ---- a worker (a forked child of a rank) ----

def worker_main(rank, index, batches, out_queue, write_path):
    parent = os.getppid()
    out = open(write_path, "ab") if write_path else None
    common.say("worker %d of rank %d started (pid %d)%s"
               % (index, rank, os.getpid(), " writing " + write_path if out else ""))
    for batch in batches:
        if os.getppid() != parent:
            os._exit(0)
        if out:
            out.write(b"x" * 4096)
            out.flush()
        out_queue.put(batch)
    out_queue.close()
    out_queue.join_thread()


def short_lived_worker():
    time.sleep(0.2)


def pause(rank, seconds):
    """An eval-like pause: no progress, while helper processes come and go."""
    ctx = multiprocessing.get_context("fork")
    common.say("rank %d pausing %.1fs" % (rank, seconds))
    until = time.monotonic() + seconds
    started = 0
    while time.monotonic() < until:
        w = ctx.Process(target=short_lived_worker, daemon=True)
        w.start()
        started += 1
        w.join()
        time.sleep(0.1)
        common.exit_if_orphaned()
    common.say("rank %d paused; %d short-lived workers came and went" % (rank, started))


# ---- a rank ----

def run_rank(args):
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])
    mine = rank == args.only_rank
    pause_step, pause_s = (int(args.pause.split(":")[0]), float(args.pause.split(":")[1])) \
        if args.pause and mine else (-1, 0.0)

    if rank == 0:
        listener = socket.create_server((addr, port), backlog=world_size)
        import threading
        threading.Thread(target=common.serve_barrier, args=(listener, world_size), name="barrier-server",
                         daemon=True).start()
    sock = common.connect(addr, port)
    log = open(args.log, "a") if args.log and mine else None
    ctx = multiprocessing.get_context("fork")
    common.say("rank %d of %d ready (pid %d)" % (rank, world_size, os.getpid()))

    step = 0
    epoch = 0
    while args.epochs == 0 or epoch < args.epochs:
        batches = ctx.Queue()
        workers = []
        for i in range(args.workers):
            mine_to_write = args.worker_write if (mine and i == 0) else None
            share = list(range(i, args.steps_per_epoch, args.workers))
            w = ctx.Process(target=worker_main, args=(rank, i, share, batches, mine_to_write), daemon=True)
            w.start()
            workers.append(w)
        for _ in range(args.steps_per_epoch):
            while True:
                try:
                    batches.get(timeout=common.POLL_S)
                    break
                except queue.Empty:
                    common.exit_if_orphaned()
            if step == pause_step:
                pause(rank, pause_s)
            common.work(args.step_time)
            if log:
                common.write_log(log, rank, step)
            common.barrier(sock, step)
            common.say("step %d" % step)
            step += 1
        for w in workers:
            w.join()
        epoch += 1
    if rank == 0:
        common.wait_until_delivered(step)
    common.say("done")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "launch":
        args = parse_args(sys.argv[1:])
        rest = [a for a in sys.argv[2:]]
        # The ranks get the same options; --nproc is the launcher's own.
        if "--nproc" in rest:
            i = rest.index("--nproc")
            del rest[i:i + 2]
        launch(args, rest)
    else:
        run_rank(parse_args(sys.argv[1:]))


if __name__ == "__main__":
    main()
