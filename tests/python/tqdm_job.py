"""A job whose only progress is a tqdm-style bar: one line, then `\\r` redraws without `\\n`, for hangwatch's tests.

    python3 tqdm_job.py SECONDS

Prints `starting` (a whole line), then redraws a progress bar on stderr with `\\r` every 100 ms for SECONDS, then
ends the bar with `\\n` and exits 0, as tqdm does.
"""

import sys
import time


def main():
    seconds = float(sys.argv[1])
    print("starting", flush=True)
    total = max(1, int(seconds / 0.1))
    for i in range(total + 1):
        pct = 100 * i // total
        sys.stderr.write("\r%3d%%|%-20s| %d/%d" % (pct, "#" * (pct // 5), i, total))
        sys.stderr.flush()
        time.sleep(0.1)
    sys.stderr.write("\n")
    print("done", flush=True)


if __name__ == "__main__":
    main()
