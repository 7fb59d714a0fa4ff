"""The Python binding against oracles: NumPy reads and writes checked
against a plain in-memory copy, files larger than the budget, flush and
reopen, read-only refusals, 2 MiB pages, threads, stats, zero copies, and
the BufferError while views exist. Each test has its own files
(tmp_path) and its own Manager."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import faultline
from conftest import run_python_child, thp_available, write_random

MiB = 1 << 20


def test_read_write_against_oracle(scratch):
    path = scratch / "a.u64"
    oracle = write_random(path, 16 * MiB, 1)
    mm = faultline.Manager(budget="32M", workers=2)
    with mm.map_file(path, mode="r+") as region:
        a = np.frombuffer(region, dtype=np.uint64)
        assert a.shape == oracle.shape
        assert np.array_equal(a, oracle)
        rng = np.random.default_rng(2)
        idx = rng.integers(0, a.size, size=10000)
        vals = rng.integers(0, 2**63, size=idx.size, dtype=np.uint64)
        a[idx] = vals
        oracle[idx] = vals
        a[100:200] += 1
        oracle[100:200] += 1
        assert np.array_equal(a, oracle)
        del a
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), oracle)


def test_file_four_times_the_budget(scratch):
    path = scratch / "big.u64"
    oracle = write_random(path, 64 * MiB, 3)
    mm = faultline.Manager(budget="16M", workers=2)
    a = faultline.open_array(path, dtype=np.uint64, mode="r+", manager=mm)
    # Two sequential passes and random gathers, far over the budget.
    assert a.sum(dtype=np.uint64) == oracle.sum(dtype=np.uint64)
    rng = np.random.default_rng(4)
    idx = rng.integers(0, a.size, size=200_000)
    assert np.array_equal(a[idx], oracle[idx])
    a[::512] = 7
    oracle[::512] = 7
    assert np.array_equal(a, oracle)
    st = mm.stats()
    assert st["evicted"] > 0
    assert st["frames_total"] * 4096 <= 16 * MiB
    a.flush()
    del a
    assert np.array_equal(np.fromfile(path, dtype=np.uint64), oracle)


def test_flush_and_reopen(scratch):
    path = scratch / "w.f32"
    shape = (1000, 333)  # not a whole number of pages
    a = faultline.open_array(path, dtype=np.float32, shape=shape, mode="w+", budget="8M")
    assert np.count_nonzero(a) == 0
    a[:] = np.arange(a.size, dtype=np.float32).reshape(shape)
    a.flush()
    assert os.path.getsize(path) == a.nbytes  # the last page's tail was cut back
    del a
    b = faultline.open_array(path, dtype=np.float32, shape=shape, mode="r", budget="8M")
    assert np.array_equal(b, np.arange(b.size, dtype=np.float32).reshape(shape))
    m = np.memmap(path, dtype=np.float32, shape=shape, mode="r")
    assert np.array_equal(b, m)
    assert os.path.getsize(path) == b.nbytes


def test_read_only_refuses_writes(scratch):
    path = scratch / "ro.bin"
    write_random(path, 1 * MiB, 5)
    before = path.read_bytes()
    mm = faultline.Manager(budget="8M")
    region = mm.map_file(path, mode="r")
    assert not region.writable
    mv = memoryview(region)
    assert mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 1
    a = np.frombuffer(region, dtype=np.uint8)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1
    with pytest.raises(ValueError):
        a.setflags(write=True)
    # A consumer that insists on a writable buffer gets BufferError.
    import ctypes
    with pytest.raises((TypeError, BufferError)):
        (ctypes.c_char * len(region)).from_buffer(region)
    with pytest.raises(TypeError):
        region.write(0, b"x")
    arr = faultline.open_array(path, dtype=np.uint8, mode="r", manager=mm)
    with pytest.raises(ValueError):
        arr[0] = 1
    del mv, a, arr
    region.close()
    assert path.read_bytes() == before


def test_huge_pages(scratch):
    if not thp_available():
        pytest.fail("2 MiB pages need transparent huge pages in madvise or always mode")
    path = scratch / "h.u32"
    oracle = write_random(path, 32 * MiB, 6).view(np.uint32)
    mm = faultline.Manager(budget="16M")
    a = faultline.open_array(path, dtype=np.uint32, mode="r+", page_size="2M", manager=mm)
    assert a.region.page_size == 2 * MiB
    assert np.array_equal(a, oracle)
    a[12345] = 42
    oracle[12345] = 42
    a.flush()
    st = mm.stats()
    assert st["faults_2m"] >= 16
    assert st["faults_4k"] == 0
    del a
    assert np.array_equal(np.fromfile(path, dtype=np.uint32), oracle)


def test_threads_release_the_gil(scratch):
    path = scratch / "t.u64"
    oracle = write_random(path, 48 * MiB, 7)
    mm = faultline.Manager(budget="16M", workers=2)
    a = faultline.open_array(path, dtype=np.uint64, mode="r", manager=mm)
    n = 4
    chunk = a.size // n
    sums = [None] * n
    gathers = [None] * n

    def work(i):
        part = a[i * chunk:(i + 1) * chunk]
        sums[i] = part.sum(dtype=np.uint64)
        idx = np.random.default_rng(i).integers(0, a.size, 20000)
        gathers[i] = np.array_equal(a[idx], oracle[idx])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(n):
        assert sums[i] == oracle[i * chunk:(i + 1) * chunk].sum(dtype=np.uint64)
        assert gathers[i]


def test_stats_is_a_dict(scratch):
    mm = faultline.Manager(budget="8M")
    st0 = mm.stats()
    assert isinstance(st0, dict)
    r = mm.map_zero("4M")
    assert r.prefetch(0, 1 * MiB) > 0
    assert r.resident_pages >= 256
    a = np.frombuffer(r, dtype=np.uint8)
    a[2 * MiB] = 1
    st = mm.stats()
    assert st["faults_4k"] > st0["faults_4k"]
    assert st["budget_frames"] * 4096 == 8 * MiB == mm.budget
    assert "service" in st and isinstance(st["service"], dict)
    assert r.resident_pages >= 257


def test_zero_copy(scratch):
    path = scratch / "z.bin"
    path.write_bytes(bytes(2 * MiB))
    mm = faultline.Manager(budget="8M")
    region = mm.map_file(path, mode="r+")
    a = np.frombuffer(region, dtype=np.uint8)
    b = np.frombuffer(region, dtype=np.uint8)
    assert a.__array_interface__["data"][0] == region.addr
    a[4096:4101] = np.frombuffer(b"hello", dtype=np.uint8)
    assert region.read(4096, 5) == b"hello"  # faultline's own read path
    assert bytes(b[4096:4101]) == b"hello"  # the other view: same memory
    region.write(8192, b"world")
    assert bytes(a[8192:8197]) == b"world"
    assert bytes(memoryview(region)[8192:8197]) == b"world"
    region.flush()
    with open(path, "rb") as f:
        f.seek(4096)
        assert f.read(5) == b"hello"
        f.seek(8192)
        assert f.read(5) == b"world"


def test_buffer_error_while_views_exist(scratch):
    mm = faultline.Manager(budget="8M")
    region = mm.map_zero("1M")
    a = np.frombuffer(region, dtype=np.uint8)
    view = a[10:20]
    del a
    with pytest.raises(BufferError):
        region.close()
    mv = memoryview(region)
    del view
    with pytest.raises(BufferError):
        region.close()
    mv.release()
    region.close()
    assert region.closed
    with pytest.raises(ValueError):
        memoryview(region)
    with pytest.raises(ValueError):
        region.flush()
    region.close()  # idempotent
    # The context manager refuses the same way, and the region stays usable.
    with pytest.raises(BufferError):
        with mm.map_zero("1M") as r2:
            keep = np.frombuffer(r2, dtype=np.uint8)
    keep[0] = 3
    assert r2.read(0, 1) == b"\x03"


def test_region_keeps_its_manager_alive():
    r = faultline.Manager(budget="8M").map_zero("1M")
    a = np.frombuffer(r, dtype=np.uint8)
    a[:] = 9
    assert a.sum() == 9 * MiB
    assert r.manager.regions == 1


def test_errors_are_exceptions(scratch):
    mm = faultline.Manager(budget="8M")
    with pytest.raises(faultline.FaultlineError, match="No such file"):
        mm.map_file(scratch / "missing", mode="r")
    with pytest.raises(ValueError, match="mode"):
        mm.map_file(scratch / "x", mode="c")
    with pytest.raises(ValueError, match="page_size"):
        mm.map_zero("1M", page_size="8K")
    with pytest.raises(ValueError, match="bad size"):
        faultline.Manager(budget="lots")
    with pytest.raises(faultline.FaultlineError, match="cannot start"):
        faultline.Manager(budget="3M")  # not a multiple of 2 MiB
    assert faultline.parse_size("2M") == 2 * MiB


def test_unservable_fault_reports_then_sigbus(scratch):
    # Zero pages are never reclaimed: touching 64 MiB of them under an
    # 8 MiB budget exhausts it, inside NumPy's C code.
    code = (
        "import faultline, numpy as np\n"
        "mm = faultline.Manager(budget='8M')\n"
        "r = mm.map_zero('64M')\n"
        "a = np.frombuffer(r, dtype=np.uint8)\n"
        "a[:] = 1\n"
        "print('not reached')\n"
    )
    p = run_python_child(code)
    assert p.returncode == -7, (p.returncode, p.stderr)  # SIGBUS
    assert "not reached" not in p.stdout
    assert "faultline: SIGBUS at 0x" in p.stderr, p.stderr
    assert "could not be served" in p.stderr
    assert "cause not recorded" not in p.stderr, p.stderr


def test_advise_random_maps_each_page_alone(scratch):
    path = scratch / "walk.bin"
    path.write_bytes(bytes(range(256)) * (4 * MiB // 256))
    counts = {}
    for pattern in ("normal", "random", "sequential"):
        mm = faultline.Manager(budget="16M")
        a = faultline.open_array(path, mode="r", manager=mm)
        a.advise(pattern)
        assert int(a[::4096].astype(np.uint64).sum()) == 0
        counts[pattern] = mm.stats()["faults_4k"]
        del a
    assert counts["random"] >= 1024, counts  # a fault a page at least
    assert counts["normal"] < 256, counts
    assert counts["sequential"] <= counts["normal"], counts
    with pytest.raises(ValueError, match="random"):
        faultline.Manager(budget="8M").map_zero("1M").advise("often")
