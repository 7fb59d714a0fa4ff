"""faultline from Python: NumPy arrays larger than memory.

A ``Manager`` holds a frame pool under a memory budget and the threads that
serve page faults (userfaultfd); ``mm.map_file(...)``, ``mm.map_zero(...)`` and
``mm.map_redis(url or [cluster node urls], length, prefix=...)`` (pages kept
in Redis: far memory)
return a ``Region`` exporting the buffer protocol, so ``np.frombuffer(region,
dtype)`` views its pages without a copy. ``open_array`` is the one-liner, like
``numpy.memmap``::

    a = faultline.open_array("data.f32", dtype="float32", shape=(n,), mode="r", budget="256M")
    a[idx].sum()

Faults are served by faultline's own threads (``fault_mode="workers"``, the
default) or by the faulting thread itself in faultline's SIGBUS handler
(``fault_mode="in-thread"``: faster random access; the kernel's own accesses
to pages not in memory, such as ``file.readinto(array)``, fail with EFAULT
unless prefetched). Neither takes the GIL. A fault that cannot be served (no
frame, a failed read) happens inside NumPy's C code, where no exception can
be raised: the process prints one line on stderr naming the address and the
cause (``faultline: SIGBUS at 0x...: a fault on a faultline region could not
be served...``), and then dies of SIGBUS (after ``faulthandler``'s
traceback, if it is enabled).
"""

import numpy as _np

import atexit as _atexit

from ._faultline import FaultlineError, Manager, Region, parse_size
from ._faultline import _remove_stats_files

# Managers Python never finalizes at exit would leave their stats files.
_atexit.register(_remove_stats_files)

__all__ = ["Array", "FaultlineError", "Manager", "Region", "open_array", "parse_size"]


class Array(_np.ndarray):
    """An ndarray over a faultline region (what ``open_array`` returns).

    Like ``numpy.memmap``: slices and views keep the region; results of
    computations are plain ndarrays. ``flush()`` writes dirty pages back;
    ``with open_array(...) as a:`` flushes on exit. The region is unmapped
    (after a last write-back) when the array and all its views are gone.
    """

    region = None

    def __array_finalize__(self, obj):
        region = getattr(obj, "region", None)
        if region is not None and _np.may_share_memory(self, obj):
            self.region = region
        else:
            self.region = None

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        arr = super().__array_wrap__(arr, context, return_scalar)
        if self is arr or type(self) is not Array:
            return arr
        if arr.shape == ():
            return arr[()]
        return arr.view(_np.ndarray)

    def __getitem__(self, index):
        res = super().__getitem__(index)
        if type(res) is Array and res.region is None:
            return res.view(type=_np.ndarray)
        return res

    def flush(self):
        """Writes dirty pages back to the file and fsyncs it."""
        if self.region is not None:
            self.region.flush()

    def prefetch(self, start=0, stop=None):
        """Maps the pages of elements ``start..stop`` (of the flattened
        array) now; returns the number of pages mapped."""
        if self.region is None:
            return 0
        n = self.size if stop is None else stop
        base = self.__array_interface__["data"][0] - self.region.addr
        return self.region.prefetch(base + start * self.itemsize, base + n * self.itemsize)

    def advise(self, pattern):
        """Declares how the array will be touched: ``"random"``,
        ``"sequential"`` or ``"normal"`` (``Region.advise``)."""
        if pattern not in ("normal", "random", "sequential"):
            raise ValueError(
                f'advise({pattern!r}): "normal", "random" or "sequential"')
        if self.region is not None:
            self.region.advise(pattern)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        return False


def open_array(path, dtype="uint8", shape=None, mode="r+", offset=0, order="C",
               budget="256M", workers=2, page_size="4K", manager=None, fault_mode="workers",
               poll_us=None):
    """Opens a file as a NumPy array served by faultline, like ``numpy.memmap``.

    ``mode``: ``"r"`` (read-only array), ``"r+"`` (read-write) or ``"w+"``
    (create or overwrite; ``shape`` required). ``shape`` defaults to the rest
    of the file as a 1-D array. ``budget`` (bytes or ``"256M"``) and
    ``workers`` configure the array's own ``Manager`` unless ``manager`` is
    given, and so does ``fault_mode`` (``"workers"`` or ``"in-thread"``: see
    ``Manager``). ``page_size``: ``"4K"`` or ``"2M"``. ``poll_us``: how long
    a thread waiting for a fault's read polls for it before it sleeps
    (``None``: the library's default, 200; ``0``: sleep at once).
    """
    dtype = _np.dtype(dtype)
    if mode not in ("r", "r+", "w+"):
        raise ValueError(f'mode is "r", "r+" or "w+", not {mode!r}')
    if shape is None:
        if mode == "w+":
            raise ValueError('mode "w+" needs a shape')
        import os
        size = os.stat(path).st_size - offset
        if size < dtype.itemsize:
            raise ValueError(f"{path}: no whole {dtype} element at offset {offset}")
        shape = (size // dtype.itemsize,)
    elif isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    count = int(_np.prod(shape, dtype=_np.int64))
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        raise ValueError("cannot map an empty array")
    if manager is None:
        manager = Manager(budget=budget, workers=workers, fault_mode=fault_mode)
    mm = manager
    region = mm.map_file(path, mode=mode, offset=offset, length=nbytes, page_size=page_size,
                         poll_us=poll_us)
    flat = _np.frombuffer(region, dtype=dtype, count=count)
    arr = flat.reshape(shape, order=order).view(Array)
    arr.region = region
    return arr
