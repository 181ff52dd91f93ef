"""A rank that beats through its shared-memory slot while DataLoader workers started by spawn, forkserver and fork
come and go, for hangwatch's tests of who owns a beat slot.

    python3 slot_workers_job.py --seconds S [--workers N]

For S seconds (and at least one epoch per start method) the rank beats every 0.1 s, from a thread of its own so
that its progress does not depend on how long a spawned worker takes to import torch on a loaded machine, while
its main thread runs epochs with N workers each, started by spawn, forkserver and fork in turn; then it prints
`workers done` and stops beating for good, so that hangwatch must find it stalled.

Like a real job, the module's top level sends the root logger's records to the agent with hangwatch.LoggingHandler.
A spawned (or forkserver-started) worker re-imports this module, and its dataset logs every item: the client
starts in every worker, with the rank's environment (HANGWATCH_BEATS, RANK, LOCAL_RANK). Uses torch's DataLoader
when torch is importable, else a `multiprocessing` pool of the same start method.
"""

import argparse
import logging
import multiprocessing
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))

import hangwatch  # noqa: E402

logging.getLogger().addHandler(hangwatch.LoggingHandler())
logging.getLogger().setLevel(logging.INFO)
log = logging.getLogger("slot_workers_job")

METHODS = ("spawn", "forkserver", "fork")
ITEMS = 8


def make_item(index):
    log.info("item %d made in worker %d", index, os.getpid())
    return index


class Items:
    """A map-style dataset whose items are made in the workers."""

    def __len__(self):
        return ITEMS

    def __getitem__(self, index):
        return make_item(index)


def epoch(method, workers):
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        with multiprocessing.get_context(method).Pool(workers) as pool:
            return sorted(pool.map(make_item, range(ITEMS)))
    loader = DataLoader(Items(), batch_size=2, num_workers=workers, multiprocessing_context=method)
    return sorted(int(x) for batch in loader for x in batch)


def beat_until(stop):
    step = 0
    while not stop.wait(0.1):
        hangwatch.beat(step)
        step += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    hangwatch.beat(0)
    stop = threading.Event()
    beater = threading.Thread(target=beat_until, args=(stop,), daemon=True)
    beater.start()
    end = time.monotonic() + args.seconds
    epochs = 0
    while time.monotonic() < end or epochs < len(METHODS):
        method = METHODS[epochs % len(METHODS)]
        assert epoch(method, args.workers) == list(range(ITEMS))
        epochs += 1
        log.info("epoch %d with %s workers done", epochs, method)
    stop.set()
    beater.join()
    print("workers done after %d epochs; beat slot: %s" % (epochs, hangwatch.stats()["beat_slot"]), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
