"""Shared fixtures: a per-test scratch directory, and the userfaultfd check
(the tests need root or /dev/userfaultfd access: they fail, with that
reason, rather than skip)."""

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


def thp_available():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
        return "[never]" not in mode
    except OSError:
        return False
