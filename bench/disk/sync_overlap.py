#!/usr/bin/env python3
"""Appends with fdatasync per second from one, two and three threads on one file.

docs/benchmarks.md ("Issue 40, fourth look") cites it: does a second sync in flight
add syncs a second on this disk, and how much slower is each? Usage:

    python3 bench/disk/sync_overlap.py [DIR]   # DIR on the disk to measure (default /tmp)
"""
import os
import sys
import tempfile
import threading
import time

SPACE = 8 << 20  # the file's preallocated size; appends wrap inside it
WRITE = 8000  # bytes per append, about a commit of eight envelopes
SECONDS = 2


def run(fd, threads):
    lock = threading.Lock()
    state = {"offset": 0, "syncs": 0}

    def worker():
        end = time.time() + SECONDS
        while time.time() < end:
            with lock:
                at = state["offset"]
                state["offset"] += WRITE
            os.pwrite(fd, b"x" * WRITE, at % SPACE)
            os.fdatasync(fd)
            with lock:
                state["syncs"] += 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    start = time.time()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return state["syncs"] / (time.time() - start)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        fd = os.open(os.path.join(tmp, "sync_overlap.dat"), os.O_RDWR | os.O_CREAT)
        os.pwrite(fd, b"\0" * SPACE, 0)
        os.fdatasync(fd)
        for threads in (1, 2, 3, 1, 2, 3):
            per_s = run(fd, threads)
            print(f"{threads} thread(s): {per_s:.0f} syncs/s, {threads / per_s * 1e3:.2f} ms each")
        os.close(fd)


if __name__ == "__main__":
    main()
