"""A job that uses the hangwatch Python client, for the end-to-end tests of `hangwatch run`.

    python3 beating_job.py [--steps N] [--step-time S] [--checkpoint-at K:SECONDS [--no-phase]
                           [--checkpoint-dir DIR]] [--hang] [--log-records M]

Each rank beats once per step. With --checkpoint-at it pauses SECONDS before step K, inside
`hangwatch.phase("checkpoint")` (or outside any phase with --no-phase), then creates a checkpoint directory in
DIR with --checkpoint-dir. With --hang every rank stops beating after
the last step and sleeps forever in `stuck_forever`. With --log-records it logs M numbered records through
`hangwatch.LoggingHandler` first.
"""

import argparse
import contextlib
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))

import hangwatch  # noqa: E402


def save_checkpoint(directory, step):
    os.mkdir(os.path.join(directory, "checkpoint-%d-rank%s" % (step, os.environ.get("RANK", "0"))))


def stuck_forever():
    while True:
        time.sleep(3600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--checkpoint-at", default=None)
    p.add_argument("--no-phase", action="store_true")
    p.add_argument("--hang", action="store_true")
    p.add_argument("--log-records", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None,
                   help="with --checkpoint-at: create a directory here inside the checkpoint (as a save does first)")
    args = p.parse_args()

    if args.log_records:
        log = logging.getLogger("job")
        log.setLevel(logging.INFO)
        handler = hangwatch.LoggingHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        for i in range(args.log_records):
            log.info("record %d", i)
        handler.flush()

    pause_step, pause_s = -1, 0.0
    if args.checkpoint_at:
        k, s = args.checkpoint_at.split(":")
        pause_step, pause_s = int(k), float(s)
    for step in range(args.steps):
        if step == pause_step:
            ctx = contextlib.nullcontext() if args.no_phase else hangwatch.phase("checkpoint")
            with ctx:
                time.sleep(pause_s)
                if args.checkpoint_dir:
                    save_checkpoint(args.checkpoint_dir, step)
        time.sleep(args.step_time)
        hangwatch.beat(step)
    if args.hang:
        stuck_forever()


if __name__ == "__main__":
    main()
