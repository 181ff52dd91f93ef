"""Cost of the zero-code instrumentation (python/bootstrap/sitecustomize.py, hangwatch._auto), per optimizer step and
at startup.

    /var/cache/hangwatch-torch/bin/python python/bench/bench_auto.py [--steps N]

Prints:
- the injected step beat called on its own (the optimizer step post hook: one slot store), median ns per call;
- `optimizer.step()` of a tiny model with the hook and without it, median ns per step (the difference is what a
  training step pays);
- interpreter start with the bootstrap on PYTHONPATH and without: `python -c pass` (the cost for a process that
  never imports torch) and `python -c "import torch"`, median ms of several starts.
Needs torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
BOOTSTRAP = os.path.join(HERE, "..", "bootstrap", "sitecustomize.py")
sys.path.insert(0, SRC)

import torch  # noqa: E402

from hangwatch import _auto, _client  # noqa: E402


def per_call_ns(fn, calls: int) -> float:
    """Median ns of one call, over blocks of 1,000 calls."""
    clock = time.perf_counter_ns
    blocks = []
    for _ in range(max(1, calls // 1000)):
        t0 = clock()
        for _ in range(1000):
            fn()
        blocks.append((clock() - t0) / 1000)
    return statistics.median(blocks)


def starts_ms(code: str, python_path: str, runs: int = 7) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGWATCH_")}
    env["PYTHONPATH"] = python_path
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200_000)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="hw-bench-auto-")
    try:
        # The agent's shared-memory slots, as `run` gives them: the step beat is one store.
        slots = os.path.join(tmp, "beats")
        with open(slots, "wb") as f:
            f.write(b"\0" * 64 * 64)
        os.environ[_client.ENV_BEATS] = slots
        os.environ["LOCAL_RANK"] = "0"
        _client._reset()
        _client.beat()  # claims the slot
        hook = _auto._step_beat
        print("step beat (the hook alone, slot):           %6.0f ns" % per_call_ns(lambda: hook(None, (), {}),
                                                                                       args.steps))

        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model(torch.ones(4, 16)).sum().backward()
        # Without and with the hook in alternating rounds (this machine's speed drifts by tens of percent over
        # seconds): the median of the per-round differences is the hook's cost per step.
        register = sys.modules["torch.optim.optimizer"].register_optimizer_step_post_hook
        rounds, withouts, withs = 15, [], []
        for _ in range(rounds):
            withouts.append(per_call_ns(opt.step, args.steps // 50))
            handle = register(hook)
            withs.append(per_call_ns(opt.step, args.steps // 50))
            handle.remove()
        diffs = sorted(w - n for w, n in zip(withs, withouts))
        print("optimizer.step() of Linear(16, 1), no hook:  %6.0f ns (median of %d rounds)"
              % (statistics.median(withouts), rounds))
        print("optimizer.step() with the step beat:         %6.0f ns  (+%.0f ns per step, median of per-round "
              "differences; quartiles %.0f .. %.0f)"
              % (statistics.median(withs), statistics.median(diffs), diffs[len(diffs) // 4],
                 diffs[3 * len(diffs) // 4]))

        boot = os.path.join(tmp, "boot")
        os.mkdir(boot)
        shutil.copy(BOOTSTRAP, boot)
        os.symlink(os.path.abspath(os.path.join(SRC, "hangwatch")), os.path.join(boot, "hangwatch"))
        for code in ("pass", "import torch"):
            plain = starts_ms(code, "")
            instrumented = starts_ms(code, boot)
            print("python -c %-14r without: %6.1f ms  with the bootstrap: %6.1f ms  (+%.1f ms)"
                  % (code, plain, instrumented, instrumented - plain))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
