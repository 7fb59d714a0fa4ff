"""NumPy arrays whose pages live in a real Redis server (far memory):
written under a budget 4x smaller than the array, read back through a new
region, and refused where the URL is wrong."""

import numpy as np
import pytest

import faultline

MiB = 1 << 20


def test_array_four_times_the_budget_round_trips_through_redis(redis_url):
    mm = faultline.Manager(budget="8M", workers=2)
    n = 32 * MiB // 8
    rng = np.random.default_rng(5)
    oracle = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    with mm.map_redis(redis_url, 32 * MiB, prefix="arr") as region:
        a = np.frombuffer(region, dtype=np.uint64)
        assert not a[:1000].any(), "a fresh region reads as zeros"
        a[:] = oracle
        assert np.array_equal(a, oracle)
        idx = rng.integers(0, n, size=20_000)
        assert np.array_equal(a[idx], oracle[idx])
        del a
    assert mm.stats()["written_back"] > 0
    # Another region over the same prefix sees the pages.
    with mm.map_redis(redis_url, 32 * MiB, prefix="arr") as region:
        assert np.array_equal(np.frombuffer(region, dtype=np.uint64), oracle)


def test_a_bad_url_is_an_exception():
    mm = faultline.Manager(budget="8M", workers=2)
    with pytest.raises(faultline.FaultlineError):
        mm.map_redis("redis://127.0.0.1:1/", MiB, prefix="x", retry_for=0)
    with pytest.raises(ValueError):
        mm.map_redis(42, MiB, prefix="x")
