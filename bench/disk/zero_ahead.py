#!/usr/bin/env python3
"""Who should zero the space a transcript keeps ahead: the writer, or a helper thread?

docs/benchmarks.md ("Issue 40, fourth look") cites it. A writer appends 10.5 KB with
fdatasync (one group commit) for a few seconds and keeps 64 KiB of zeros ahead:
- `inline`: the writer writes and syncs the zeros itself, as botmesh's writer does;
- `helper`: a helper thread writes them through a second, O_DIRECT descriptor (no dirty
  pages for the writer's fdatasync to wait on) and syncs that; the writer waits only when
  it catches up with the zeroing.
Usage:

    python3 bench/disk/zero_ahead.py inline|helper [DIR]   # DIR on the disk (default /tmp)
"""
import mmap
import os
import sys
import tempfile
import threading
import time

CHUNK = 64 << 10
LINE = b"x" * 10500
SECONDS = 4


def percentile(xs, p):
    return sorted(xs)[int(p * (len(xs) - 1))] * 1e3 if xs else 0.0


def main():
    mode = sys.argv[1]
    folder = sys.argv[2] if len(sys.argv) > 2 else "/tmp"
    if mode not in ("inline", "helper"):
        sys.exit("mode: inline or helper")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = os.path.join(tmp, "zero_ahead.dat")
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        zeros = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
        os.pwrite(fd, bytes(CHUNK), 0)
        os.fdatasync(fd)
        size, ready, length = CHUNK, CHUNK, 0
        lock, wake = threading.Lock(), threading.Condition()
        asked, stop = [], [False]
        zeroed = {"ready": ready}

        def helper(direct):
            while True:
                with wake:
                    while not asked and not stop[0]:
                        wake.wait(0.01)
                    if stop[0]:
                        return
                    start = asked.pop(0)
                os.pwritev(direct, [zeros], start)
                os.fdatasync(direct)
                with lock:
                    zeroed["ready"] = start + CHUNK

        if mode == "helper":
            direct = os.open(path, os.O_RDWR | os.O_DIRECT)
            threading.Thread(target=helper, args=(direct,), daemon=True).start()
        commits, inline_syncs, waits = [], [], 0
        begin = time.time()
        while time.time() - begin < SECONDS:
            if mode == "inline":
                if size - length < CHUNK // 4:
                    t = time.time()
                    os.pwrite(fd, bytes(CHUNK), size)
                    os.fdatasync(fd)
                    inline_syncs.append(time.time() - t)
                    size += CHUNK
            else:
                with lock:
                    ready = zeroed["ready"]
                if size - length < CHUNK and size == ready:
                    with wake:
                        asked.append(size)
                        wake.notify()
                    size += CHUNK
                while True:
                    with lock:
                        ready = zeroed["ready"]
                    if length + len(LINE) <= ready:
                        break
                    waits += 1
                    time.sleep(0.0001)
            t = time.time()
            os.pwrite(fd, LINE, length)
            os.fdatasync(fd)
            commits.append(time.time() - t)
            length += len(LINE)
        stop[0] = True
        print(
            f"{mode}: {len(commits) / SECONDS:.0f} commits/s, commit sync p50 "
            f"{percentile(commits, .5):.2f} p90 {percentile(commits, .9):.2f} p99 "
            f"{percentile(commits, .99):.2f} ms; the writer's own zeroing syncs: "
            f"{len(inline_syncs)} (p50 {percentile(inline_syncs, .5):.2f} ms); waits for the helper: {waits}"
        )


if __name__ == "__main__":
    main()
