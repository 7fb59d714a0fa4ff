"""libfaultline_preload.so under a plain NumPy program (issue 41): a child
Python that never imports faultline maps a file 8 times the budget with
``numpy.memmap``, with ``LD_PRELOAD`` and ``FAULTLINE_FILES`` naming the
file, so that faultline serves the mapping under a 16 MiB budget. Its
gather at random indices and its sum must equal the oracle the parent
wrote; in mode ``'r+'`` its writes, flushed (``msync``) and unmapped, must
be in the file when the parent reads it back without the preload. The
library's report line (``FAULTLINE_PRELOAD_REPORT=1``) must show that it
served the mapping (``regions>=1``: the test never passes because the
kernel did the work) and evicted pages. The library is built first
(``cargo build --release -p faultline-preload`` from the repository root);
each test has its own files."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import run_python_child, write_random

MiB = 1 << 20
BUDGET = 16 * MiB
ROOT = Path(__file__).resolve().parents[3]

REPORT = re.compile(
    r"^faultline-preload: regions=(\d+) faults=(\d+) fills=(\d+) "
    r"written_back=(\d+) evicted=(\d+) budget=(\d+)\s*$", re.M)
FIELDS = ("regions", "faults", "fills", "written_back", "evicted", "budget")


@pytest.fixture(scope="module")
def preload_so():
    """The release build of the library (built here: cargo checks that it
    is up to date)."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    out = subprocess.run([cargo, "build", "--release", "-q", "-p", "faultline-preload"],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail("cargo build --release -p faultline-preload failed: " + out.stderr[-2000:])
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    so = (target if target.is_absolute() else ROOT / target) / "release" / "libfaultline_preload.so"
    if not so.is_file():
        pytest.fail(f"cargo built faultline-preload, and {so} is not there")
    return so


@pytest.fixture
def work(scratch):
    """The test's scratch directory, removed at the end also when the test
    fails (its files are 128 MiB; pytest would keep them)."""
    yield scratch
    shutil.rmtree(scratch, ignore_errors=True)


def run_preloaded(so, code, files, timeout=120):
    """Runs ``code`` in a child Python under the preload (files ``files``,
    a 16 MiB budget, the report at exit); its result. A child still
    running after ``timeout`` seconds is killed and the test fails."""
    env = dict(os.environ, LD_PRELOAD=str(so), FAULTLINE_FILES=files,
               FAULTLINE_BUDGET="16M", FAULTLINE_PRELOAD_REPORT="1")
    env.pop("FAULTLINE_WORKERS", None)
    return run_python_child(code, timeout=timeout, env=env)


def report(res):
    """The child's report line as a dict; checks that the library served
    the mapping with the budget asked for and said nothing else."""
    lines = REPORT.findall(res.stderr)
    assert lines, f"no faultline-preload report line (was the library loaded?); stderr:\n{res.stderr}"
    r = dict(zip(FIELDS, map(int, lines[-1])))
    other = [l for l in res.stderr.splitlines()
             if "faultline-preload:" in l and not REPORT.match(l)]
    assert not other, f"the preload complained: {other}"
    assert r["regions"] >= 1, f"the preload served no mapping: {r}; stderr:\n{res.stderr}"
    assert r["fills"] > 0, r
    assert r["budget"] == BUDGET, r
    print(r)
    return r


def test_memmap_gather_and_sum_over_a_file_eight_times_the_budget(work, preload_so):
    path = work / "big.u64"
    oracle = write_random(path, 128 * MiB, 41)
    idx = np.random.default_rng(42).integers(0, oracle.size, size=50_000)
    np.save(work / "idx.npy", idx)
    code = f"""
import numpy as np
mm = np.memmap({str(path)!r}, dtype=np.uint64, mode="r")
idx = np.load({str(work / "idx.npy")!r})
np.save({str(work / "got.npy")!r}, mm[idx])
print(int(mm.sum(dtype=np.uint64)))
del mm
"""
    res = run_preloaded(preload_so, code, f"{work}/*.u64")
    assert res.returncode == 0, res.stderr
    assert np.array_equal(np.load(work / "got.npy"), oracle[idx])
    assert int(res.stdout.strip()) == int(oracle.sum(dtype=np.uint64))
    r = report(res)
    assert r["evicted"] > 0, f"128 MiB through a 16 MiB budget evicted nothing: {r}"


def test_memmap_writes_reach_the_file(work, preload_so):
    path = work / "rw.u64"
    oracle = write_random(path, 128 * MiB, 43)
    rng = np.random.default_rng(44)
    idx = np.unique(np.concatenate([rng.integers(0, oracle.size, size=100_000),
                                    np.arange(oracle.size - 600, oracle.size)]))
    vals = rng.integers(0, 2**63, size=idx.size, dtype=np.uint64)
    np.save(work / "idx.npy", idx)
    np.save(work / "vals.npy", vals)
    # Writes all over the file, a sum (every page read again: dirty pages
    # are evicted, written back, and read back), the writes checked, then
    # flush (msync) and unmap.
    code = f"""
import numpy as np
mm = np.memmap({str(path)!r}, dtype=np.uint64, mode="r+")
idx = np.load({str(work / "idx.npy")!r})
vals = np.load({str(work / "vals.npy")!r})
mm[idx] = vals
print(int(mm.sum(dtype=np.uint64)))
assert np.array_equal(mm[idx], vals), "the writes read back in the child"
mm.flush()
del mm
"""
    res = run_preloaded(preload_so, code, f"{work}/*.u64")
    assert res.returncode == 0, res.stderr
    oracle[idx] = vals
    assert int(res.stdout.strip()) == int(oracle.sum(dtype=np.uint64))
    back = np.fromfile(path, dtype=np.uint64)
    assert back.size == oracle.size, "the file kept its size"
    wrong = np.flatnonzero(back != oracle)
    assert wrong.size == 0, f"{wrong.size} words differ in the file, the first ones at words {wrong[:5]}"
    r = report(res)
    assert r["evicted"] > 0, f"128 MiB through a 16 MiB budget evicted nothing: {r}"
    assert r["written_back"] > 0, f"written words reached the file with nothing written back: {r}"
