"""A small real torch job for trying hangwatch by hand: torchrun ranks (gloo), a DataLoader whose forked workers
are started anew every epoch, an all_reduce per step, and rank 0 logging to a file (optionally on a filesystem that
the person trying it freezes).

    hangwatch run -- torchrun --nproc-per-node 2 tests/python/torch_job.py --rank0-log /mnt/x/rank0.log
    hangwatch run -- torchrun --nproc-per-node 2 tests/python/torch_job.py --trainer   # the same under HF Trainer

Needs torch (and transformers + accelerate for --trainer); the CI suite uses dependency-free stand-ins
(rank.py, worker_job.py) instead.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __init__(self, n=256, item_time=0.0):
        self.n = n
        self.item_time = item_time

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.item_time:
            time.sleep(self.item_time)
        x = torch.full((16,), float(i % 7))
        return {"x": x, "labels": x.sum().unsqueeze(0)}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 1)

    def forward(self, x, labels=None):
        out = self.lin(x)
        if labels is None:
            return {"logits": out}
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def beat_function():
    """hangwatch.beat from this repository's client, or a no-op without it."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "python", "src"))
    try:
        import hangwatch
        return hangwatch.beat
    except ImportError:
        return lambda step=None: None


def plain_loop(args, rank):
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    log = open(args.log, "a", buffering=1) if args.log and rank == 0 else None
    if args.host_log:
        # Every rank logs under a directory named after its node: a test freezes one node's directory.
        import socket
        node_dir = os.path.join(args.host_log, socket.gethostname())
        log = open(os.path.join(node_dir, f"rank{rank}.log"), "a", buffering=1)
    beat = beat_function()
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank} resumed at step {step} (attempt {os.environ.get('HANGWATCH_ATTEMPT', '1')})", flush=True)
    for epoch in range(args.epochs):
        loader = DataLoader(Numbers(item_time=args.item_time), batch_size=16, num_workers=args.workers)
        for batch in loader:
            loss = model(**batch)["loss"]
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            step += 1
            beat(step=step)
            if args.checkpoint and rank == 0 and step % args.save_steps == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
            if args.steps and step >= args.steps:
                return
            if log:
                log.write(f"epoch {epoch} step {step} loss {loss.item():.3f}\n")
            if args.pause and step == args.pause[0]:
                time.sleep(args.pause[1])
            print(f"rank {rank} step {step}", flush=True)
            time.sleep(args.step_time)


def trainer_loop(args, rank):
    from transformers import Trainer, TrainingArguments

    out = args.output_dir or f"/tmp/hangwatch-torch-job-{os.getpid()}"
    training = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=16,
        num_train_epochs=args.epochs,
        logging_steps=1,
        save_steps=args.save_steps,
        dataloader_num_workers=args.workers,
        report_to=[],
        use_cpu=True,
    )
    trainer = Trainer(model=Tiny(), args=training, train_dataset=Numbers(item_time=args.item_time))
    trainer.train()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank0-log", dest="log", help="rank 0 appends a line per step here (not --log: torchrun takes that)")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--item-time", type=float, default=0.0)
    parser.add_argument("--pause", type=int, nargs=2, metavar=("STEP", "SECONDS"))
    parser.add_argument("--trainer", action="store_true", help="train with the Hugging Face Trainer")
    parser.add_argument("--output-dir", help="Trainer checkpoints")
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--checkpoint", help="plain loop: rank 0 saves here every --save-steps; all resume from it")
    parser.add_argument("--host-log", help="plain loop: every rank appends to HOST_LOG/<hostname>/rank<R>.log")
    parser.add_argument("--steps", type=int, default=0, help="plain loop: stop after this step (0: --epochs)")
    args = parser.parse_args()
    if args.trainer:
        trainer_loop(args, int(os.environ.get("RANK", "0")))
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} of {dist.get_world_size()} ready (pid {os.getpid()})", flush=True)
    plain_loop(args, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
