"""Shared fixtures and helpers: a per-test scratch directory, the random
oracle file (``write_random``), and the userfaultfd check (the tests need
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


def thp_available():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
        return "[never]" not in mode
    except OSError:
        return False


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of this test's own on a free 127.0.0.1 port (no
    persistence), stopped at the end. Fails, saying so, without
    redis-server."""
    import shutil
    import socket
    import subprocess
    import time

    if shutil.which("redis-server") is None:
        pytest.fail("this test needs redis-server (apt-get install -y redis-server)")
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
