"""Shared fixtures and helpers: a per-test scratch directory, the random
oracle file (``write_random``), a child Python that cleans up after
itself (``run_python_child``), a redis-server of the test's own
(``redis_url``, installed when missing), and the userfaultfd check (the tests need
root or /dev/userfaultfd access: they fail, with that reason, rather than
skip)."""

import os

import pytest


def _uffd_ok():
    if os.geteuid() == 0:
        return True
    try:
        fd = os.open("/dev/userfaultfd", os.O_RDWR)
        os.close(fd)
        return True
    except OSError:
        return False


@pytest.fixture(autouse=True)
def need_userfaultfd():
    if not _uffd_ok():
        pytest.fail("faultline needs userfaultfd: run as root or with read-write access to /dev/userfaultfd")


@pytest.fixture
def scratch(tmp_path):
    """A directory of this test's own (pytest's tmp_path is per test)."""
    return tmp_path


def write_random(path, nbytes, seed):
    """Writes ``nbytes`` of random uint64 words to ``path``; returns them
    (the oracle)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2**63, size=nbytes // 8, dtype=np.uint64)
    data.tofile(path)
    return data


def run_python_child(code, timeout=120, env=None):
    """Runs ``code`` in a child Python (with environment ``env``, or this
    one's); its result (``subprocess``'s). A child still running after
    ``timeout`` seconds is killed and the test fails, saying so. A child
    that dies of a signal (the SIGBUS tests) runs no exit handler, so its
    managers' stats files are removed here after it."""
    import glob
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child Python still ran after {timeout} s (hung?); stderr:\n{err}")
    finally:
        proc.kill()
        proc.wait()
        for f in glob.glob(f"/dev/shm/faultline/{proc.pid}-*"):
            os.remove(f)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def thp_available():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
        return "[never]" not in mode
    except OSError:
        return False


def ensure_redis_server():
    """Installs Debian's redis-server when it is not on PATH (root with
    apt-get, as the Rust tests' harness does; one install at a time, under
    an exclusive lock on the temporary directory); fails the test,
    saying why, where it cannot."""
    import fcntl
    import shutil
    import subprocess
    import tempfile

    if shutil.which("redis-server"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail("this test needs redis-server, which is not on PATH (apt-get install -y redis-server)")
    # An exclusive flock on the temporary directory itself (as the Rust
    # harness takes): nothing is created, so nothing is left behind.
    fd = os.open(tempfile.gettempdir(), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if shutil.which("redis-server"):
            return
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "redis-server"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            out = subprocess.run(install, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                pytest.fail("this test needs redis-server; apt-get install failed: " + out.stderr[-300:])
    finally:
        os.close(fd)
    if shutil.which("redis-server") is None:
        pytest.fail("this test needs redis-server: installed, and still not on PATH")


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of this test's own on a free 127.0.0.1 port (no
    persistence), stopped at the end; installed first if missing
    (``ensure_redis_server``)."""
    import socket
    import subprocess
    import time

    ensure_redis_server()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"redis-server on port {port} did not start")
        time.sleep(0.02)
    yield f"redis://127.0.0.1:{port}/"
    proc.kill()
    proc.wait()
