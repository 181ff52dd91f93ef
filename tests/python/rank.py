"""A stand-in for one rank of a distributed training job, for hangwatch's system tests.

Started by the Rust test kit (crates/testkit, `RankGroup`) with torchrun's environment: RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Every step it does a bit of work, appends a line to its log (kept open, so a
frozen filesystem puts it in D state inside write()), then waits in `barrier` until every rank has arrived. Rank 0
serves the barrier over TCP from a thread. It prints `step N` on stdout after each barrier.

One rank can be told to misbehave (--behaviour), to reproduce the hangs hangwatch must explain:
  barrier     normal (the default); `sigstop` is the same here: the test stops the process itself
  spin        after --after steps, compute forever (busy while peers wait)
  lock        after --after steps, deadlock on a threading lock (a data-loader style hang)
  abba        after --after steps, the main thread and a thread named `metrics-flusher` take two locks in
              opposite orders (`with step_lock:` then `with metrics_lock:`, and the reverse): both wait for ever
  rlock       after --after steps, a thread named `ckpt-saver` takes an RLock and waits on a queue for the main
              thread, which waits to take the same RLock before it would put anything there
  exit        after --after steps, exit with code 3 (peers wait for a rank that is gone)
  async_checkpoint
              from --after steps on, save a checkpoint to --fs-dir every step in a thread named `ckpt-writer`
              (an async checkpoint writer, 1 MiB and fsync) that the main thread then joins: on a frozen
              filesystem the writer sleeps in D and the main thread waits for it in join()
  mmap_stall  map --mmap-file MAP_SHARED and touch it; when triggered (SIGUSR1 or --trigger-file appears) one
              thread writes to the page and 0.5 s later another munmaps it. On a frozen filesystem the write fault
              waits while holding the memory-area lock and munmap waits behind it holding the mmap lock, so every
              reader of this process's memory map (/proc/PID/cmdline, maps, process_vm_readv) blocks until the thaw.

--fs-op OP --fs-dir DIR does one filesystem call in DIR every step, as a checkpoint save would (on a frozen mount
it blocks there): mkdir (a new checkpoint directory), openat (a new file, relative to a directory fd), rename (two
names swapped), stat (a lookup of a name that does not exist), odirect (a 1 MiB O_DIRECT write: slow, not stuck,
when the test throttles the device), mmapwrite (a store into a shared file mapping, then msync: on a frozen mount
the store's page fault waits on the superblock, in no system call and naming no file), mmapread (every
`shard-*.bin` in DIR mapped read-only, as a dataset library maps its shards; each step reads one byte of a page never
read before, 1 MiB past the last, from shard step % N: on a stopped mount the read is a page fault that waits, in no
system call), import (DIR on sys.path; each step imports module `hw_mod_STEP` from it, as a job importing a module
from a package directory on a shared filesystem would), flock (an exclusive flock on DIR/shared.lock, taken and
released, as jobs serialise a shared cache or download: a process holding it makes the rank wait).

--prefetch FILE --prefetch-rank R: rank R starts a thread named `prefetch` (a data loader's read-ahead) that reads FILE
one page at a time through a read-only shared mapping, dropping the file from the page cache before each page: every
read is a page fault that waits for the device, in D (folio_wait_bit_common) and in no system call, for a moment
each; on a device the test throttles, nearly all the time, yet never for long.

--only-rank R applies --log, --behaviour, --fs-op and --pause to rank R only, for launchers that give every rank the same
arguments (`hangwatch run --nproc N`); --pause STEP:SECONDS sleeps before one step (a checkpoint-like pause).

--checkpoint FILE --checkpoint-every N: rank 0 saves the step every N steps (write and rename); every rank starts
from the saved step + 1 and prints `resumed at step S (attempt A)` (A from HANGWATCH_ATTEMPT, else 1). With --steps,
the job ends at that step whatever attempt reaches it. --beat reports each step with hangwatch.beat(step) (the
client from this repository's python/). In --log, {host} and {rank} stand for the host name and the rank.

Dependency-free on purpose (--beat imports the repository's own client). Exits by itself when the process that
started it dies.
"""

import argparse
import ctypes
import os
import signal
import socket
import sys
import threading
import time

ORIGINAL_PARENT = os.getppid()
POLL_S = 0.5


_say_lock = threading.Lock()


def say(text):
    """Prints one whole line: print() writes text and newline separately, which threads would interleave."""
    with _say_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def orphaned():
    return os.getppid() != ORIGINAL_PARENT


def exit_if_orphaned():
    if orphaned():
        os._exit(0)


# ---- the barrier: rank 0 serves it, every rank (rank 0 too) is a client ----

_delivered = threading.Condition()
_rounds_delivered = 0


def serve_barrier(listener, world_size):
    """Accepts one connection per rank, then each round reads `arrive` from all of them and answers `go`."""
    global _rounds_delivered
    conns = []
    while len(conns) < world_size:
        conn, _ = listener.accept()
        conns.append(conn.makefile("rwb", buffering=0))
    try:
        while True:
            for conn in conns:
                line = conn.readline()
                if not line:
                    # A rank is gone: like a real collective, the others are left waiting.
                    return
            for conn in conns:
                conn.write(b"go\n")
            with _delivered:
                _rounds_delivered += 1
                _delivered.notify_all()
    except ConnectionError:
        return


def wait_until_delivered(rounds):
    """Rank 0 hosts the barrier: it may receive `go` before its peers do, so before it leaves (done, or exit) it
    waits until every peer was told `go` for the `rounds` rounds it passed; otherwise they would wait forever."""
    with _delivered:
        while _rounds_delivered < rounds:
            _delivered.wait(POLL_S)
            exit_if_orphaned()


def connect(addr, port, deadline_s=60):
    until = time.monotonic() + deadline_s
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=5)
            sock.settimeout(POLL_S)
            return sock
        except OSError:
            if time.monotonic() > until:
                raise
            exit_if_orphaned()
            time.sleep(0.05)


def barrier(sock, step):
    """Waits until every rank has arrived at `step`; a lost peer leaves us waiting here, as NCCL would.

    The connection to the barrier server is lost when a peer is gone: closed, or reset when the server dropped
    unread data. Either way this rank then waits here (in `barrier`, so its stack says where) until orphaned."""
    lost = False
    try:
        sock.sendall(b"arrive %d\n" % step)
    except ConnectionError:
        lost = True
    received = b""
    while not lost and not received.endswith(b"\n"):
        try:
            chunk = sock.recv(16)
        except socket.timeout:
            exit_if_orphaned()
            continue
        except ConnectionError:
            chunk = b""
        if not chunk:
            lost = True
        received += chunk
    while lost:
        time.sleep(POLL_S)
        exit_if_orphaned()


# ---- what a step does ----

class FsOp:
    """One filesystem call per step in `directory`, named so that the Python stack says which."""

    def __init__(self, op, directory):
        self.op, self.directory = op, directory
        if op == "openat":
            self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        if op == "rename":
            self.a, self.b = os.path.join(directory, "state-a"), os.path.join(directory, "state-b")
            if not os.path.exists(self.b):
                open(self.a, "a").close()
            else:
                self.a, self.b = self.b, self.a

    def step(self, rank, step):
        getattr(self, "do_" + self.op)(rank, step)

    def do_flock(self, rank, step):
        import fcntl
        if not hasattr(self, "lock_fd"):
            self.lock_fd = os.open(os.path.join(self.directory, "shared.lock"), os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def do_mkdir(self, rank, step):
        os.mkdir(os.path.join(self.directory, "ckpt-r%d-%d" % (rank, step)))

    def do_openat(self, rank, step):
        fd = os.open("f-r%d-%d" % (rank, step), os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=self.dir_fd)
        os.close(fd)

    def do_rename(self, rank, step):
        os.rename(self.a, self.b)
        self.a, self.b = self.b, self.a

    def do_odirect(self, rank, step):
        import mmap
        if not hasattr(self, "direct_fd"):
            self.direct_fd = os.open(os.path.join(self.directory, "direct-r%d.bin" % rank),
                                     os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
            self.direct_buf = mmap.mmap(-1, 1 << 20)
            self.direct_buf.write(b"x" * (1 << 20))
        os.pwrite(self.direct_fd, self.direct_buf, 0)

    def do_mmapwrite(self, rank, step):
        import mmap
        if not hasattr(self, "mapped"):
            path = os.path.join(self.directory, "mapped-r%d.bin" % rank)
            with open(path, "wb") as f:
                f.truncate(16 * mmap.PAGESIZE)
            self.mapped_fd = os.open(path, os.O_RDWR)
            self.mapped = mmap.mmap(self.mapped_fd, 16 * mmap.PAGESIZE, mmap.MAP_SHARED)
        page = step % 16
        self.mapped[page * mmap.PAGESIZE] = step % 256
        self.mapped.flush()

    def do_mmapread(self, rank, step):
        import glob
        import mmap
        if not hasattr(self, "shards"):
            self.shards = []
            for path in sorted(glob.glob(os.path.join(self.directory, "shard-*.bin"))):
                with open(path, "rb") as f:
                    self.shards.append(mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ))
        shard = self.shards[step % len(self.shards)]
        offset = (step // len(self.shards)) * (1 << 20) % len(shard)
        return shard[offset]

    def do_import(self, rank, step):
        import importlib
        if self.directory not in sys.path:
            sys.path.insert(0, self.directory)
        importlib.import_module("hw_mod_%d" % step)

    def do_stat(self, rank, step):
        try:
            os.stat(os.path.join(self.directory, "absent-r%d-%d" % (rank, step)))
        except FileNotFoundError:
            pass


def work(seconds):
    until = time.monotonic() + seconds
    x = 0
    while time.monotonic() < until:
        for i in range(1000):
            x += i * i
    return x


def write_log(log, rank, step):
    log.write("rank %d step %d\n" % (rank, step))
    log.flush()


# ---- misbehaviours ----

def save_in_thread(directory, step):
    """An async checkpoint writer: a thread named `ckpt-writer` writes 1 MiB and fsyncs; the main thread joins it."""
    def write():
        with open(os.path.join(directory, "ckpt-%d.bin" % step), "wb") as f:
            f.write(b"\0" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())

    writer = threading.Thread(target=write, name="ckpt-writer")
    writer.start()
    writer.join()


def spin():
    x = 0
    while True:
        x = (x + 1) % 1000003
        if x == 0:
            exit_if_orphaned()


def load_batch():
    """Deadlocks: takes a lock it already holds (what a forked data-loader worker with a held lock does)."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def abba():
    """Deadlocks two threads on two locks taken in opposite orders; each takes its first lock before the other
    tries it (the events only make that order certain)."""
    step_lock, metrics_lock = threading.Lock(), threading.Lock()
    main_holds, flusher_holds = threading.Event(), threading.Event()

    def flush():
        with metrics_lock:
            flusher_holds.set()
            main_holds.wait()
            with step_lock:
                pass

    threading.Thread(target=flush, name="metrics-flusher", daemon=True).start()
    with step_lock:
        main_holds.set()
        flusher_holds.wait()
        with metrics_lock:
            pass


def rlock_wait():
    """Deadlocks on an RLock whose owner (`ckpt-saver`) waits elsewhere: on a queue the main thread would fill
    only once it has the RLock."""
    import queue
    state_lock = threading.RLock()
    handed = queue.Queue()
    saver_holds = threading.Event()

    def save():
        with state_lock:
            saver_holds.set()
            handed.get()

    threading.Thread(target=save, name="ckpt-saver", daemon=True).start()
    saver_holds.wait()
    with state_lock:
        handed.put("state")


class MappedPage:
    """One page of a file mapped MAP_SHARED read/write through libc (ctypes calls release the GIL)."""

    PAGE = 4096

    def __init__(self, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.memset.restype = ctypes.c_void_p
        self.libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, self.PAGE)
        addr = self.libc.mmap(None, self.PAGE, 0x1 | 0x2, 0x01, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
        os.close(fd)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap failed: " + os.strerror(ctypes.get_errno()))
        self.addr = addr
        ctypes.c_char.from_address(addr).value  # read fault: the page is mapped read-only until written

    def write(self):
        self.libc.memset(self.addr, 0x42, 1)

    def unmap(self):
        self.libc.munmap(self.addr, self.PAGE)


def prefetch(path):
    """Reads `path` page by page in a thread named `prefetch`, each page a page fault that waits for the device.

    The whole file is dropped from the page cache (unmapped, then POSIX_FADV_DONTNEED) before each page: a large
    folio that holds the page is only dropped whole. The read is a ctypes memmove, so the fault waits with the GIL
    released and the rank's main thread steps on meanwhile."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    page = 4096
    addr = libc.mmap(None, size, 0x1, 0x01, fd, 0)  # PROT_READ, MAP_SHARED
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap failed: " + os.strerror(ctypes.get_errno()))
    madv_random, madv_dontneed = 1, 4
    libc.madvise(addr, size, madv_random)  # no read-ahead: one fault, one read
    byte = ctypes.create_string_buffer(1)

    def read_pages():
        n = 0
        while True:
            libc.madvise(addr, size, madv_dontneed)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            ctypes.memmove(byte, addr + (n % (size // page)) * page, 1)
            n += 1

    threading.Thread(target=read_pages, name="prefetch", daemon=True).start()


def stall_on_mmap(page, trigger_file):
    triggered = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: triggered.set())

    def wait_for_trigger():
        while not triggered.wait(0.05):
            if trigger_file and os.path.exists(trigger_file):
                break
        say("mmap writing")
        started = threading.Event()
        writer = threading.Thread(target=write_mapped_page, args=(page, started), name="mmap-writer",
                                  daemon=True)
        writer.start()
        # The write must be under way (blocked in its page fault) before the munmap: on a loaded machine the
        # writer thread can take longer than the pause to get the GIL, and a munmap first would make its write
        # fault on an unmapped page (SIGSEGV) instead of stalling.
        started.wait()
        time.sleep(0.5)
        say("mmap unmapping")
        unmap_page(page)
        say("mmap unmapped")

    threading.Thread(target=wait_for_trigger, name="mmap-stall", daemon=True).start()


def write_mapped_page(page, started):
    started.set()
    page.write()
    say("mmap written")


def unmap_page(page):
    page.unmap()


# ---- main ----

def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=0, help="steps to run, 0 = until killed")
    p.add_argument("--step-time", type=float, default=0.01, help="seconds of computation per step")
    p.add_argument("--log", help="file to append a line to every step")
    p.add_argument("--behaviour", default="barrier",
                   choices=["barrier", "sigstop", "spin", "lock", "exit", "mmap_stall",
                            "async_checkpoint", "abba", "rlock"])
    p.add_argument("--after", type=int, default=0, help="steps before misbehaving (spin, lock, exit, abba, rlock)")
    p.add_argument("--mmap-file", help="file to map (mmap_stall)")
    p.add_argument("--trigger-file", help="start the mmap stall when this file appears (mmap_stall)")
    p.add_argument("--fs-op", choices=["mkdir", "openat", "rename", "stat", "odirect", "mmapwrite", "mmapread",
                                          "import", "flock"],
                   help="one filesystem call in --fs-dir every step (see above)")
    p.add_argument("--fs-dir", help="directory for --fs-op")
    p.add_argument("--only-rank", type=int,
                   help="apply --log, --behaviour and --pause to this rank only (when every rank gets the same "
                        "arguments, as under `hangwatch run --nproc N`)")
    p.add_argument("--prefetch", metavar="FILE", help="a thread of --prefetch-rank reads FILE in page faults (see above)")
    p.add_argument("--prefetch-rank", type=int, default=0, help="the rank that runs --prefetch")
    p.add_argument("--pause", metavar="STEP:SECONDS",
                   help="sleep SECONDS before step STEP (an irregular step: a checkpoint or an eval)")
    p.add_argument("--checkpoint", help="file rank 0 saves the step to, and every rank resumes from")
    p.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    p.add_argument("--beat", action="store_true", help="hangwatch.beat(step) every step")
    return p.parse_args()


def resume_step(path):
    """The step after the one saved in the checkpoint, 0 without one."""
    try:
        with open(path) as f:
            return int(f.read().strip()) + 1
    except (OSError, ValueError):
        return 0


def save_checkpoint(path, step):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % step)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])
    if args.only_rank is not None and args.only_rank != rank:
        args.log, args.behaviour, args.pause, args.fs_op = None, "barrier", None, None
    pause_step, pause_s = (int(args.pause.split(":")[0]), float(args.pause.split(":")[1])) if args.pause else (-1, 0)

    if rank == 0:
        listener = socket.create_server((addr, port), backlog=world_size)
        threading.Thread(target=serve_barrier, args=(listener, world_size), name="barrier-server",
                         daemon=True).start()
    sock = connect(addr, port)
    if args.log:
        args.log = args.log.replace("{host}", socket.gethostname()).replace("{rank}", str(rank))
    log = open(args.log, "a") if args.log else None
    beat = None
    if args.beat:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
        import hangwatch
        beat = hangwatch.beat
    fs_op = FsOp(args.fs_op, args.fs_dir) if args.fs_op else None
    if args.prefetch and args.prefetch_rank == rank:
        prefetch(args.prefetch)

    if args.behaviour == "mmap_stall":
        if not args.mmap_file:
            sys.exit("rank.py: mmap_stall needs --mmap-file")
        stall_on_mmap(MappedPage(args.mmap_file), args.trigger_file)
        say("mmap ready")

    say("rank %d of %d ready (pid %d)" % (rank, world_size, os.getpid()))
    step = 0
    if args.checkpoint:
        step = resume_step(args.checkpoint)
        say("resumed at step %d (attempt %s)" % (step, os.environ.get("HANGWATCH_ATTEMPT", "1")))
    first_step = step
    while args.steps == 0 or step < args.steps:
        exit_if_orphaned()
        if step == args.after:
            if args.behaviour == "spin":
                say("spinning")
                spin()
            elif args.behaviour == "lock":
                say("deadlocking")
                load_batch()
            elif args.behaviour == "abba":
                say("deadlocking two threads")
                abba()
            elif args.behaviour == "rlock":
                say("deadlocking on an rlock")
                rlock_wait()
            elif args.behaviour == "exit":
                if rank == 0:
                    wait_until_delivered(step - first_step)
                say("exiting with code 3")
                os._exit(3)
        if step == pause_step:
            time.sleep(pause_s)
        if args.behaviour == "async_checkpoint" and step >= args.after:
            save_in_thread(args.fs_dir, step)
        work(args.step_time)
        if log:
            write_log(log, rank, step)
        if fs_op:
            fs_op.step(rank, step)
        barrier(sock, step)
        if beat:
            beat(step=step)
        if args.checkpoint and rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, step)
        say("step %d" % step)
        step += 1
    if rank == 0:
        wait_until_delivered(step - first_step)
    say("done")


if __name__ == "__main__":
    main()
