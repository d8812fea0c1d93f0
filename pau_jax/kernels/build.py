"""Compiling, caching and registering the C++ Q8_0 kernel with XLA, and whether it can run here.

The shared library is built at first use with g++ into
``$XDG_CACHE_HOME/pau_jax/kernels/<hash>/libq8.so`` (``~/.cache`` when the variable is
unset), keyed by a hash of the source, the compiler flags, the compiler's version and
jaxlib's version. It is compiled under a temporary name and renamed into place, so
processes building it at once do not race. ``available()`` is False, with one log line
saying why, when the default JAX backend is not the CPU, the CPU lacks AVX2 or FMA, there
is no ``g++`` or the compile fails; callers then use the pure-JAX path. Where the CPU also
has AVX-512 VNNI the kernel takes its 512-bit path (`instructions()` says which; chosen at
run time, the library is the same).
"""

import ctypes
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jaxlib

TARGET = "pau_q8_matmul"
SOURCE = pathlib.Path(__file__).with_name("q8_matmul.cc")
COMPILER = "g++"
FLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC", "-std=c++17", "-w")
LIBRARY_NAME = "libq8.so"
SYMBOL = "PauQ8Matmul"
_COMPILE_TIMEOUT_S = 300

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_result: list[tuple[bool, str | None]] = []  # Filled once by _status().
_library: list[ctypes.CDLL] = []  # The loaded kernel library, once registered.


def cache_dir() -> pathlib.Path:
    """The root of the kernel cache: ``$XDG_CACHE_HOME/pau_jax/kernels`` or ``~/.cache/...``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "pau_jax" / "kernels"


def _cpu_flags() -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (empty when it cannot be read)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _compiler_version(compiler: str) -> str:
    result = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    return result.stdout.splitlines()[0] if result.stdout else ""


def library_path(compiler: str) -> pathlib.Path:
    """Where the library built from the current source and flags with ``compiler`` lives."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    for part in (*FLAGS, _compiler_version(compiler), jaxlib.__version__, jax.ffi.include_dir()):
        key.update(b"\0" + part.encode())
    return cache_dir() / key.hexdigest()[:16] / LIBRARY_NAME


def compile_library(compiler: str) -> pathlib.Path:
    """Builds the library unless the cache holds it; returns its path.

    Raises:
      RuntimeError: the compiler failed (with its first error line).
    """
    path = library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=LIBRARY_NAME + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=_COMPILE_TIMEOUT_S
        )
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if "error" in line]
            first = errors[0] if errors else result.stderr.strip()[-300:]
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {first}")
        os.replace(tmp, path)  # Atomic: a parallel build of the same key writes the same file.
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _why_unavailable() -> str | None:
    """None when the kernel can be built and registered here, else the reason."""
    backend = jax.default_backend()
    if backend != "cpu":
        return f"the default JAX backend is {backend!r}, not 'cpu'"
    missing = {"avx2", "fma"} - _cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))} (per /proc/cpuinfo)"
    compiler = shutil.which(COMPILER)
    if compiler is None:
        return f"no {COMPILER} on PATH"
    try:
        path = compile_library(compiler)
        library = ctypes.CDLL(str(path))
        capsule = jax.ffi.pycapsule(getattr(library, SYMBOL))
        jax.ffi.register_ffi_target(TARGET, capsule, platform="cpu")
        _library.append(library)
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as error:
        return f"building or loading the kernel failed: {error}"
    return None


def _status() -> tuple[bool, str | None]:
    """(available, reason), worked out and logged once per process."""
    with _lock:
        if not _result:
            reason = _why_unavailable()
            if reason is None:
                _log.info("Q8_0 CPU kernel ready (FFI target %s, %s)", TARGET, instructions())
            else:
                _log.warning("Q8_0 CPU kernel unavailable, using the pure-JAX path: %s", reason)
            _result.append((reason is None, reason))
        return _result[0]


def available() -> bool:
    """Whether the C++ kernel is built and registered (builds it on the first call)."""
    return _status()[0]


def unavailable_reason() -> str | None:
    """Why ``available()`` is False; None when it is True."""
    return _status()[1]


def instructions() -> str:
    """The kernel's instruction path on this CPU: 'avx512-vnni' or 'avx2'.

    '' until ``available()`` has built and registered the kernel, or where it cannot.
    """
    if not _library:
        return ""
    return "avx512-vnni" if _library[0].PauQ8HasAvx512Vnni() else "avx2"
