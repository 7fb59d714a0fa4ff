#!/usr/bin/env python3
"""faultline.open_array vs numpy.memmap over a file 4x faultline's budget.

Two patterns, each side in a child process placed in a memory cgroup (v1)
of the same limit, the page cache dropped before every run:

- gather: ``a[idx]`` with ``idx`` random (float64 elements; each touches
  a random 4 KiB page), in elements per second;
- sum: ``a.sum()`` over the whole file, in MiB/s.

Rows: faultline (4 KiB pages, and 2 MiB pages: ``faultline-2M``) with
fault workers, the same with faults served in the faulting thread
(``fault_mode="in-thread"``: the sides ending in ``-it``), either with
``-sleep`` appended (``poll_us=0``: a fault's read sleeps in ``pread``
instead of being polled, the default), numpy.memmap
without a hint, and numpy.memmap with the hint a user would give it (its
``_mmap``'s ``madvise``: MADV_RANDOM for gathers, MADV_SEQUENTIAL for the
sum).
Median and spread (min..max) over ``--runs`` runs; JSON lines with
``--json``. Root and a memory cgroup controller are needed: cgroup v1's
``memory`` mount or cgroup v2 (found in /proc/self/mountinfo; on v2 the
memory controller is enabled for the hierarchy root's children).

    python bench/out_of_core.py --runs 5            # 1 GiB file, 256 MiB budget, 320 MiB limit
"""

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


def memory_hierarchy():
    """(version, mount point) of the hierarchy holding the memory
    controller: a cgroup v1 ``memory`` mount, else cgroup2 listing
    ``memory`` in cgroup.controllers; None if neither."""
    v1 = v2 = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(" "), right.split(" ")
            if len(fields) < 5 or len(rest) < 3:
                continue
            point = fields[4].replace("\\040", " ")
            if rest[0] == "cgroup" and "memory" in rest[2].strip().split(",") and v1 is None:
                v1 = point
            elif rest[0] == "cgroup2" and v2 is None:
                v2 = point
    if v1:
        return 1, v1
    if v2:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            if "memory" in f.read().split():
                return 2, v2
    return None


def make_cgroup(limit):
    """A fresh memory cgroup with ``limit`` bytes; its directory."""
    found = memory_hierarchy()
    if os.geteuid() != 0 or found is None:
        sys.exit("needs root and a memory cgroup controller (cgroup v1 `memory` or cgroup v2)")
    version, root = found
    if version == 2:
        control = os.path.join(root, "cgroup.subtree_control")
        with open(control) as f:
            enabled = f.read().split()
        if "memory" not in enabled:
            try:
                with open(control, "w") as f:
                    f.write("+memory")
            except OSError as e:
                sys.exit(f"cgroup v2: cannot enable the memory controller in {control}: {e}")
    cg = os.path.join(root, f"faultline-issue20-bench-{os.getpid()}")
    os.makedirs(cg, exist_ok=True)
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    with open(os.path.join(cg, name), "w") as f:
        f.write(str(limit))
    return cg


def child(args):
    # Into the cgroup first: everything after (NumPy, the pool, the page
    # cache) is charged to it.
    with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    import numpy as np

    import faultline

    n = args.data_mib * MiB // 8
    if args.side.startswith("faultline"):
        page = "2M" if args.side.startswith("faultline-2M") else "4K"
        side = args.side.removesuffix("-sleep")
        mode = "in-thread" if side.endswith("-it") else "workers"
        poll = 0 if args.side.endswith("-sleep") else None
        mm = faultline.Manager(budget=args.budget_mib * MiB, workers=2,
                               small_zone_pct=100 if page == "4K" else 0, fault_mode=mode)
        a = faultline.open_array(args.path, dtype=np.float64, shape=(n,), mode="r",
                                 manager=mm, page_size=page, poll_us=poll)
    else:
        a = np.memmap(args.path, dtype=np.float64, shape=(n,), mode="r")
        if args.side == "memmap-hint":
            a._mmap.madvise(mmap.MADV_RANDOM if args.pattern == "gather" else mmap.MADV_SEQUENTIAL)
    if args.pattern == "gather":
        idx = np.random.default_rng(args.seed).integers(0, n, size=args.gathers)
        t0 = time.perf_counter()
        out = a[idx]
        dt = time.perf_counter() - t0
        rate = args.gathers / dt
        check = float(out.sum())
    else:
        t0 = time.perf_counter()
        check = float(a.sum())
        dt = time.perf_counter() - t0
        rate = args.data_mib / dt
    print(json.dumps({"side": args.side, "pattern": args.pattern, "secs": dt, "rate": rate,
                      "check": check}))


def sides(args, pattern):
    return (args.gather_sides if pattern == "gather" else args.sum_sides).split(",")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def make_file(path, data_mib):
    if os.path.exists(path) and os.path.getsize(path) == data_mib * MiB:
        return
    import numpy as np
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(data_mib):
            f.write(rng.random(MiB // 8).tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-mib", type=int, default=256)
    p.add_argument("--data-mib", type=int, help="file size (default 4x the budget)")
    p.add_argument("--limit-mib", type=int,
                   help="cgroup limit of every run (default: budget + 64 MiB for the interpreter, "
                        "NumPy, the index array and faultline's metadata)")
    p.add_argument("--gathers", type=int, default=65536)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--path", default="/tmp/faultline-issue20-bench.f64")
    p.add_argument("--json", action="store_true")
    p.add_argument("--patterns", default="gather,sum")
    p.add_argument("--gather-sides", default="faultline,faultline-it,memmap,memmap-hint",
                   help="faultline-2M is left out by default: each random element reads a 2 MiB page")
    p.add_argument("--sum-sides",
                   default="faultline,faultline-it,faultline-2M,faultline-2M-it,memmap,memmap-hint")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--pattern", help=argparse.SUPPRESS)
    p.add_argument("--cgroup", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.data_mib = args.data_mib or 4 * args.budget_mib
    if args.child:
        return child(args)
    limit = (args.limit_mib or args.budget_mib + 64) * MiB
    cg = make_cgroup(limit)
    make_file(args.path, args.data_mib)
    results = {}
    try:
        for run in range(args.runs):
            for pattern in args.patterns.split(","):
                for side in sides(args, pattern):
                    drop_caches()
                    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--side", side,
                           "--pattern", pattern, "--cgroup", cg, "--path", args.path,
                           "--budget-mib", str(args.budget_mib), "--data-mib", str(args.data_mib),
                           "--gathers", str(args.gathers), "--seed", str(run + 1)]
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                    if out.returncode != 0:
                        r = {"side": side, "pattern": pattern, "error": out.returncode,
                             "stderr": out.stderr[-400:]}
                    else:
                        r = json.loads(out.stdout.strip().splitlines()[-1])
                    if args.json:
                        print(json.dumps(r), flush=True)
                    results.setdefault((pattern, side), []).append(r)
    finally:
        os.rmdir(cg)
    print(f"# file {args.data_mib} MiB, faultline budget {args.budget_mib} MiB, "
          f"cgroup limit {limit // MiB} MiB, {args.runs} runs, caches dropped before each")
    print(f"{'pattern':8} {'side':14} {'median':>12} {'min':>12} {'max':>12}  unit     vs memmap  vs memmap-hint")
    for pattern in args.patterns.split(","):
        unit = "elem/s" if pattern == "gather" else "MiB/s"
        med = {}
        for side in sides(args, pattern):
            rates = [r["rate"] for r in results.get((pattern, side), []) if "rate" in r]
            if rates:
                med[side] = statistics.median(rates)
        for side in sides(args, pattern):
            rs = results.get((pattern, side), [])
            rates = [r["rate"] for r in rs if "rate" in r]
            if not rates:
                print(f"{pattern:8} {side:14} failed: {rs[-1] if rs else 'not run'}")
                continue
            m = statistics.median(rates)
            vs = lambda k: f"{m / med[k]:.2f}x" if k in med else "-"
            print(f"{pattern:8} {side:14} {m:12.0f} {min(rates):12.0f} {max(rates):12.0f}  {unit:7}  "
                  f"{vs('memmap'):>8}  {vs('memmap-hint'):>13}")


if __name__ == "__main__":
    main()
