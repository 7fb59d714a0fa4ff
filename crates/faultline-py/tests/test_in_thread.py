"""The in-thread fault mode (``fault_mode="in-thread"``): NumPy's own
thread serves its faults in faultline's SIGBUS handler. Checked against
oracles (a file 4x the budget, gathers, writes, flush, threads), the
kernel's own accesses (``EFAULT`` until prefetched), an unservable fault
(one line naming the cause, then SIGBUS), and a SIGBUS handler installed
over faultline's (the next in-thread manager refuses to start). Each test
has its own files and its own Manager; the process-wide cases run in a
child interpreter."""

import errno
import subprocess
import sys
import threading

import numpy as np
import pytest

import faultline
from conftest import run_python_child, write_random

MiB = 1 << 20


def in_thread(budget):
    mm = faultline.Manager(budget=budget, workers=2, fault_mode="in-thread")
    assert mm.fault_mode == "in-thread"
    assert "fault_mode='in-thread'" in repr(mm)
    return mm


def test_fault_mode_is_checked():
    assert faultline.Manager(budget="8M").fault_mode == "workers"
    with pytest.raises(ValueError, match="fault_mode"):
        faultline.Manager(budget="8M", fault_mode="signal")


def test_a_file_four_times_the_budget(scratch):
    path = scratch / "big.u64"
    oracle = write_random(path, 64 * MiB, 11)
    mm = in_thread("16M")
    a = faultline.open_array(path, dtype=np.uint64, mode="r+", manager=mm)
    assert a.sum(dtype=np.uint64) == oracle.sum(dtype=np.uint64)
    rng = np.random.default_rng(12)
    idx = rng.integers(0, a.size, size=200_000)
    assert np.array_equal(a[idx], oracle[idx])
    vals = rng.integers(0, 2**63, size=idx.size, dtype=np.uint64)
    a[idx] = vals
    oracle[idx] = vals
    assert np.array_equal(a, oracle)
    st = mm.stats()
    assert st["evicted"] > 0 and st["written_back"] > 0
    assert st["errors"] == 0, mm.errors()
    a.flush()
    del a
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), oracle)


def test_open_array_makes_an_in_thread_manager(scratch):
    path = scratch / "o.f64"
    oracle = np.random.default_rng(13).random(MiB)
    oracle.tofile(path)
    a = faultline.open_array(path, dtype=np.float64, mode="r", budget="4M",
                             fault_mode="in-thread")
    assert a.region.manager.fault_mode == "in-thread"
    idx = np.random.default_rng(14).integers(0, a.size, 50_000)
    assert np.array_equal(a[idx], oracle[idx])
    assert a.sum() == oracle.sum()


def test_threads_serve_their_own_faults(scratch):
    path = scratch / "t.u64"
    oracle = write_random(path, 48 * MiB, 15)
    mm = in_thread("16M")
    a = faultline.open_array(path, dtype=np.uint64, mode="r", manager=mm)
    n = 4
    chunk = a.size // n
    ok = [False] * n

    def work(i):
        part = a[i * chunk:(i + 1) * chunk]
        s = part.sum(dtype=np.uint64) == oracle[i * chunk:(i + 1) * chunk].sum(dtype=np.uint64)
        idx = np.random.default_rng(i).integers(0, a.size, 20000)
        ok[i] = s and np.array_equal(a[idx], oracle[idx])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(ok)
    assert mm.errors() == []


def test_kernel_accesses_get_efault_until_prefetched(scratch):
    src = scratch / "src.bin"
    src.write_bytes(bytes(range(256)) * (2 * MiB // 256))
    mm = in_thread("8M")
    r = mm.map_zero("2M")
    view = memoryview(r)
    with open(src, "rb", buffering=0) as f:
        # read(2) into pages not yet in memory: the kernel's own access
        # cannot be served in this mode.
        with pytest.raises(OSError) as e:
            f.readinto(view[:MiB])
        assert e.value.errno == errno.EFAULT
        f.seek(0)
        assert r.prefetch(0, MiB) > 0
        assert f.readinto(view[:MiB]) == MiB
    assert bytes(view[:512]) == bytes(range(256)) * 2
    # Workers serve the kernel's accesses too.
    w = faultline.Manager(budget="8M").map_zero("2M")
    with open(src, "rb", buffering=0) as f:
        assert f.readinto(memoryview(w)[:MiB]) == MiB
    del view
    assert mm.errors() == []


def run_child(code):
    return run_python_child(code)


def test_unservable_fault_reports_once_then_sigbus():
    # Zero pages are never reclaimed: 64 MiB of them under an 8 MiB
    # budget exhausts it, inside NumPy's C code, in the faulting thread.
    p = run_child(
        "import faultline, numpy as np\n"
        "mm = faultline.Manager(budget='8M', fault_mode='in-thread')\n"
        "a = np.frombuffer(mm.map_zero('64M'), dtype=np.uint8)\n"
        "a[:] = 1\n"
        "print('not reached')\n")
    assert p.returncode == -7, (p.returncode, p.stderr)  # SIGBUS
    assert "not reached" not in p.stdout
    lines = [l for l in p.stderr.splitlines() if l.startswith("faultline: SIGBUS at 0x")]
    assert len(lines) == 1, p.stderr
    assert "could not be served in this thread" in lines[0]
    assert "no free 4k frame" in lines[0], lines[0]


def test_a_handler_installed_over_faultlines_is_refused():
    # faulthandler installs its own SIGBUS handler over faultline's: the
    # next in-thread manager says so instead of starting (its faults would
    # go to faulthandler).
    p = run_child(
        "import faulthandler, faultline\n"
        "first = faultline.Manager(budget='4M', fault_mode='in-thread')\n"
        "faulthandler.enable()\n"
        "try:\n"
        "    faultline.Manager(budget='4M', fault_mode='in-thread')\n"
        "    print('started')\n"
        "except faultline.FaultlineError as e:\n"
        "    print('refused:', e)\n")
    assert p.returncode == 0, p.stderr
    assert "refused:" in p.stdout and "another SIGBUS handler" in p.stdout, p.stdout


def test_faulthandler_enabled_first_is_fine():
    # Enabled before the first in-thread manager (python -X faulthandler,
    # pytest), faulthandler stays behind faultline's handler: faults are
    # served, and an unserved one still reaches it.
    p = run_child(
        "import faulthandler, faultline, numpy as np\n"
        "faulthandler.enable()\n"
        "mm = faultline.Manager(budget='8M', fault_mode='in-thread')\n"
        "a = np.frombuffer(mm.map_zero('4M'), dtype=np.uint8)\n"
        "a[:] = 3\n"
        "print('sum', int(a.sum(dtype=np.uint64)))\n"
        "b = np.frombuffer(mm.map_zero('64M'), dtype=np.uint8)\n"
        "b[:] = 1\n")
    assert f"sum {3 * 4 * MiB}" in p.stdout, (p.stdout, p.stderr)
    assert p.returncode == -7, (p.returncode, p.stderr)
    assert "could not be served in this thread" in p.stderr
    assert "Fatal Python error: Bus error" in p.stderr, p.stderr
