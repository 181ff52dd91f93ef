"""A real torch job that knows nothing of hangwatch: it never imports it and prints nothing while it trains. Ranks
(gloo, CPU) do an optimizer step with an all_reduce every --step-time seconds; optionally one rank deadlocks on a
lock after --deadlock-after steps (its peers then wait in the next all_reduce); with --mismatch-after, every rank
issues its gradients' collective asynchronously and waits for it at one line, and at that step --mismatch-rank
issues an all_gather where the others issue an all_reduce (gloo then waits forever, and all stacks are the same);
with --hold-gil-after, --hold-gil-rank enters a C call that never lets go of the GIL (a regular expression that
backtracks forever) while its peers wait in the next all_reduce; with --save-at, rank 0 saves --save-mb MB with
`torch.save` to --save-to at that step (its peers wait in the next all_reduce meanwhile) and writes how many seconds
it took to --save-seconds-to; --print-path prints PYTHONPATH first (for the test of what `run` puts in the ranks'
environment).

    hangwatch run --nproc 2 -- python tests/python/plain_torch_job.py --steps 100
"""

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--deadlock-after", type=int, default=-1)
    p.add_argument("--deadlock-rank", type=int, default=1)
    p.add_argument("--mismatch-after", type=int, default=-1)
    p.add_argument("--mismatch-rank", type=int, default=1)
    p.add_argument("--hold-gil-after", type=int, default=-1)
    p.add_argument("--hold-gil-rank", type=int, default=1)
    p.add_argument("--save-at", type=int, default=-1)
    p.add_argument("--save-to")
    p.add_argument("--save-mb", type=int, default=64)
    p.add_argument("--save-seconds-to")
    p.add_argument("--print-path", action="store_true")
    args = p.parse_args()
    if args.print_path:
        print("PYTHONPATH=" + os.environ.get("PYTHONPATH", "<unset>"), flush=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if step == args.deadlock_after and rank == args.deadlock_rank:
            load_batch()
        if step == args.hold_gil_after and rank == args.hold_gil_rank:
            parse_header()
        if step == args.save_at and rank == 0:
            save_checkpoint(args.save_to, args.save_mb, args.save_seconds_to)
        opt.zero_grad()
        model(torch.ones(4, 16)).sum().backward()
        if args.mismatch_after >= 0:
            if step == args.mismatch_after and rank == args.mismatch_rank:
                world = dist.get_world_size()
                work = dist.all_gather([torch.zeros(4) for _ in range(world)], torch.zeros(4), async_op=True)
            else:
                work = dist.all_reduce(model.weight.grad, async_op=True)
            work.wait()
        else:
            for param in model.parameters():
                dist.all_reduce(param.grad)
        opt.step()
        time.sleep(args.step_time)
    dist.destroy_process_group()


def save_checkpoint(path, mb, seconds_to):
    """`torch.save` of `mb` MB to `path`, timed into `seconds_to` (not on the filesystem being tested)."""
    began = time.monotonic()
    torch.save({"weights": torch.zeros(mb * 2**20 // 4)}, path)
    took = time.monotonic() - began
    with open(seconds_to, "w") as f:
        f.write(f"{took:.2f}\n")


def parse_header():
    """Backtracks for ever inside the regular expression engine, a C call that holds the GIL throughout."""
    import re

    re.match(r"(a+)+$", "a" * 64 + "b")


def load_batch():
    """Deadlocks: takes a lock it already holds."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


if __name__ == "__main__":
    main()
