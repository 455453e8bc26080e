"""The project's own C++ kernels (engine/kernels/csrc/): built once per machine against the installed torch, loaded
on first use, and `None` wherever they cannot be built (no compiler, a failed build): every caller then keeps the
PyTorch path, and the reason is logged once.

Sources are of two kinds. Files named `*_avx2.cpp` or `*_avx512.cpp` hold the kernels for one instruction set,
in plain C++ over raw pointers (no torch headers, no inline templates from the standard library: a weak symbol
compiled for AVX-512 could otherwise be linked into code that runs on an AVX2 CPU); each is compiled with its own
`-m` flags into an object file. The other `.cpp` files bind those kernels to tensors (pybind11, torch's thread
pool) and choose the instruction set at run time from what the CPU reports (`isa()`), so one build runs on an
AVX2-only EPYC, an AVX512-BF16/VNNI EPYC and an AMX Xeon alike. `FLEXBATCH_ISA=avx2` (or `scalar`) pins a lower
set, for tests of the other paths on a CPU that has more (a pin above what the CPU has is logged, naming the set
that runs); `FLEXBATCH_KERNELS=off` turns the build off. Both are checked as options are (engine/env_settings.py).

The build lands in <environment>/share/flexbatch-kernels/<key> (beside the torch it was built against; in
CACHE_ROOT/kernels where the environment is read-only), the key hashing the sources, the flags, torch's version and
the compiler's, so a changed source or another torch builds anew and nothing stale is ever loaded; the library is
checked against the size and SHA-256 its build recorded before it is loaded, and built again where it does not
match (engine/kernels/build_folder.py). `make venv` builds it (`python -m engine.kernels.compiled`), so a first run
does not wait for the compiler (128 s on a 2-core AMX Xeon that other processes kept busy; a few minutes on 2
cores in general), and the build logs its own time."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from engine import trace
from engine.cache_root import CACHE_ROOT
from engine.env_settings import isa_pin, kernels_off
from engine.kernels.build_folder import discard, sweep_dead_builds, unsound, work_folder, write_record

log = logging.getLogger(__name__)
SOURCES = Path(__file__).parent / "csrc"
NAME = "flexbatch_kernels"
ISA_FLAGS = {  # per instruction set: the flags its object files are compiled with
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
               "-mavx512vnni", "-mavx512bf16"],
}
ISA_NAMES = {"avx512": "avx512", "avx2": "avx2", "none": "scalar"}  # select_isa()'s answer -> FLEXBATCH_ISA's word
COMMON_FLAGS = ["-O3", "-fPIC", "-std=c++17", "-fno-math-errno", "-fvisibility=hidden"]
_lock = threading.Lock()
_loaded: list = []  # [module or None] once tried


class BuildError(RuntimeError):
    pass


def ops():
    """The compiled kernels module, or None where it cannot be had (the reason logged once per process)."""
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load_or_none())
    return _loaded[0]


def _load_or_none():
    pin = isa_pin()  # checked before anything is built: a bad value is one EnvSettingError
    if kernels_off():
        log.info("own kernels off (FLEXBATCH_KERNELS=%s): the PyTorch kernels run", os.environ["FLEXBATCH_KERNELS"])
        return None
    try:
        module = load(build_if_missing=True)
    except (BuildError, OSError, ImportError) as e:
        log.warning("the project's C++ kernels are unavailable, the PyTorch kernels run instead: %s", e)
        return None
    chosen = ISA_NAMES.get(module.select_isa(pin), "scalar")
    if pin and chosen != pin:
        log.warning("FLEXBATCH_ISA=%s asks for more than this CPU has: the own kernels run with %s", pin, chosen)
    else:
        log.info("own kernels: instruction set %s%s", chosen, f" (pinned by FLEXBATCH_ISA={pin})" if pin else "")
    return module


def profiled(name: str):
    """A profiler range KERNEL + `name` around a compiled kernel's call (engine/trace.py): `flexbatch bench ops` sees
    these kernels through them, as it sees aten's ops."""
    return trace.scope(trace.KERNEL + name)


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


@functools.cache
def build_key() -> str:
    """The build's name: a hash of the sources, flags, torch, Python and the compiler's version, computed once per
    process (none of them changes under it; the hardware profile's key reads it at every plan)."""
    h = hashlib.sha256()
    for path in sorted(SOURCES.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(repr((ISA_FLAGS, COMMON_FLAGS, torch.__version__, sys.version_info[:2])).encode())
    cxx = compiler()
    if cxx:
        h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    home = Path(sys.prefix) / "share" / "flexbatch-kernels"
    writable = os.access(home if home.exists() else Path(sys.prefix), os.W_OK)
    return (home if writable else CACHE_ROOT / "kernels") / build_key()


def load(build_if_missing: bool = True):
    """Import the built module; build it first where it is missing or does not match its record
    (`build_if_missing`; else a BuildError says why)."""
    if NAME in sys.modules:  # built in this process (build() imports what it built)
        return sys.modules[NAME]
    folder = build_dir()
    sweep_dead_builds(folder.parent)  # what builds killed before their rename left, at each process's first load
    target = folder / f"{NAME}.so"
    if target.exists() and (why := unsound(target)):
        log.warning("the kernel library %s %s; %s", target, why,
                    "building it again" if build_if_missing else "it is not loaded")
        discard(folder)
    if not target.exists():
        if not build_if_missing:
            raise BuildError(f"not built: {target}")
        return build()
    spec = importlib.util.spec_from_file_location(NAME, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def build():
    """Compile the sources into build_dir()/flexbatch_kernels.so (objects per instruction set, then the
    bindings against torch), record its size and SHA-256 beside it, and import it. Atomic: a finished build is
    renamed into place, so a concurrent loader never sees half a build (what dead builds left is removed by `load`)."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (install g++, or set CXX)")
    final = build_dir()
    work = work_folder(final)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log.warning("building the project's C++ kernels once for this machine and torch (2-5 minutes on 2 cores) in %s",
                final)
    started = time.perf_counter()
    try:
        module = _compile(cxx, work)
        write_record(work / f"{NAME}.so")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        work.rename(final)
    except OSError:  # another process finished the same build first
        shutil.rmtree(work, ignore_errors=True)
    log.warning("built the project's C++ kernels in %.0f s", time.perf_counter() - started)
    return module


def _compile(cxx: str, work: Path):
    objects = [_compile_isa(cxx, src, work) for src in sorted(SOURCES.glob("*.cpp")) if _isa_of(src)]
    bindings = [str(src) for src in sorted(SOURCES.glob("*.cpp")) if not _isa_of(src)]
    from torch.utils import cpp_extension

    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # the env's ninja
    try:
        return cpp_extension.load(NAME, bindings, extra_cflags=["-O3", "-fopenmp"], extra_ldflags=objects,
                                  extra_include_paths=[str(SOURCES)], build_directory=str(work), verbose=False)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        raise BuildError(f"building the bindings failed: {e}") from e


def _isa_of(src: Path) -> str | None:
    stem = src.stem
    return next((isa for isa in ISA_FLAGS if stem.endswith("_" + isa)), None)


def _compile_isa(cxx: str, src: Path, work: Path) -> str:
    obj = work / (src.stem + ".o")
    cmd = [cxx, *COMMON_FLAGS, *ISA_FLAGS[_isa_of(src)], f"-I{SOURCES}", "-c", str(src), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"compiling {src.name} failed:\n{done.stderr[-4000:]}")
    return str(obj)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module = load(build_if_missing=True)
    module.select_isa("")
    print(f"flexbatch kernels built in {build_dir()}: instruction set {module.isa()}")
