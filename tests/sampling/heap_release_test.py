"""The sampler hands the C heap's free pages back to the OS after each call (`runtime`)."""

import ctypes
import sys

import pytest

from pau_jax.sampling import generate, runtime

pytestmark = pytest.mark.skipif(
    runtime._TRIM is None, reason="glibc's malloc_trim is not in this process"
)

CHUNK = 48 * 1024  # below glibc's smallest mmap threshold (128 KiB): served from the heap
COUNT = 4096  # 192 MiB in all


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def _fragmented_heap(libc):
    """Allocates COUNT heap chunks, touches them, frees all but every 16th (returned: kept)."""
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(CHUNK) for _ in range(COUNT)]
    for address in chunks:
        ctypes.memset(address, 1, CHUNK)
    for i, address in enumerate(chunks):
        if i % 16:
            libc.free(address)
    return chunks[::16]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_release_returns_the_free_pages_between_live_heap_blocks():
    libc = ctypes.CDLL(None)
    kept = _fragmented_heap(libc)
    try:
        before = _rss_mib()
        assert runtime.release_freed_memory()
        after = _rss_mib()
    finally:
        for address in kept:
            libc.free(address)
    # 180 of the 192 MiB are free but lie between live chunks: glibc keeps them resident
    # until trimmed (the heap's top alone is returned on free).
    assert before - after > 100, (before, after)


def test_generate_releases_the_heap_after_each_call(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(runtime, "release_freed_memory", lambda: calls.append(1) or True)
    generate(tiny_model, [[3, 17, 42], [5, 9]], max_new_tokens=2)
    generate(tiny_model, [[7, 8, 9]], max_new_tokens=2)
    assert len(calls) == 2
