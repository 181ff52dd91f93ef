"""Real torch jobs whose ranks are not in any starting RANK: how hangwatch must still find them (docs/run.md, "Who is
a rank"). Each rank prints `rank R of N ready (pid P)`, keeps a DataLoader with forked workers alive (workers, never
ranks), beats, and meets its peers in an all_reduce every step; rank 0 logs each step to --log (on the test's
loop-mounted ext4, which the test freezes).

    launchers.py mp-spawn --nproc 4 --log PATH     # torch.multiprocessing.spawn(work, nprocs=4)
    launchers.py srun-tasks --nproc 4 --log PATH   # 4 tasks with SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS only;
                                                   # RANK is copied from SLURM_PROCID inside Python (idr_torch)
    launchers.py task --log PATH                   # one such task (what srun starts)
    mpirun -np 4 -x MASTER_PORT launchers.py mpi-task --log PATH   # Open MPI tasks (OMPI_COMM_WORLD_RANK)
    launchers.py lightning --log PATH [--callback] # Lightning 2.x Trainer(devices=2, strategy="ddp"), checkpoints
                                                   # every 5 steps into ckpt/ next to --log
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Numbers(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return torch.full((4,), float(i % 7))


def say(line):
    """One write per line: the ranks share hangwatch's pipe, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def loader():
    return DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context="fork")


def train(rank, world, log, step_time):
    import hangwatch  # its rank watcher reports once torch.distributed is initialized

    torch.set_num_threads(1)
    batches = iter(loader())
    say(f"rank {rank} of {world} ready (pid {os.getpid()})")
    out = open(log, "a") if rank == 0 and log else None
    step = 0
    while True:
        x = next(batches)
        t = torch.tensor([float(x.sum())])
        dist.all_reduce(t)
        if out is not None:
            out.write(f"step {step}\n")
            out.flush()
            os.fsync(out.fileno())
        hangwatch.beat(step)
        step += 1
        time.sleep(step_time)


def spawned(index, world, port, log, step_time):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=index, world_size=world)
    train(index, world, log, step_time)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mp_spawn(args):
    import torch.multiprocessing as mp

    mp.spawn(spawned, args=(args.nproc, free_port(), args.log, args.step_time), nprocs=args.nproc)


def srun_tasks(args):
    port = free_port()
    procs = []
    for i in range(args.nproc):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        env.update(SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NTASKS=str(args.nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, os.path.abspath(__file__), "task", "--step-time", str(args.step_time)]
        if args.log:
            cmd += ["--log", args.log]
        procs.append(subprocess.Popen(cmd, env=env))
    sys.exit(max(p.wait() for p in procs))


def task(args):
    # As Jean Zay's idr_torch and much cluster code do: the rank comes from Slurm, set at run time.
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    dist.init_process_group("gloo")
    train(dist.get_rank(), dist.get_world_size(), args.log, args.step_time)


def mpi_task(args):
    # Open MPI's mpirun gives each task OMPI_COMM_WORLD_RANK/_LOCAL_RANK/_SIZE; the script hands them to torch.
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo")
    train(dist.get_rank(), dist.get_world_size(), args.log, args.step_time)


def lightning(args):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            if i == 0:
                say(f"rank {self.global_rank} of {self.trainer.world_size} ready (pid {os.getpid()})")
            say(f"step {i}")
            time.sleep(args.step_time)
            return self.lin(batch).pow(2).mean()

        def train_dataloader(self):
            return DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True,
                              multiprocessing_context="fork")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    callbacks = []
    if args.callback:
        # Without it, nothing of hangwatch is imported: the ranks are known by the process tree alone.
        from hangwatch.integrations.lightning import HangwatchCallback

        callbacks.append(HangwatchCallback())
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(os.path.dirname(args.log), "ckpt"),
                                        every_n_train_steps=5, save_top_k=-1)
    trainer = pl.Trainer(devices=2, strategy="ddp", accelerator="cpu", max_steps=10 ** 6, callbacks=callbacks + [ckpt],
                         logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["mp-spawn", "srun-tasks", "task", "mpi-task", "lightning"])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--log", default="")
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--callback", action="store_true")
    args = p.parse_args()
    modes = {"mp-spawn": mp_spawn, "srun-tasks": srun_tasks, "task": task, "mpi-task": mpi_task, "lightning": lightning}
    modes[args.mode](args)


if __name__ == "__main__":
    main()
