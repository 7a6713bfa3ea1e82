"""Decode attention that reads the paged KV cache in place on the CPU (a C++ operator).

On CPU the SDPA decode path (``paged_attention._sdpa_decode``) spent about half of a
decode step of a tiny model (4 heads / 2 KV heads x 64) at batch 32 copying every
sequence's K and V rows out of the cache (``gather_rows``) for SDPA to read again. ``cpu_paged_decode.cpp`` reads each
row once, in place, and is registered as ``torch.ops.omni_cpu.paged_decode``.

Built at first use with the machine's C++ compiler against torch's headers (only light
ones: a few seconds, where ``load_inline``'s torch/extension.h took ~35 s on a 2-core
VM), with portable flags (no -march=native: the cached build may be reused on another
CPU of the same architecture; no -ffast-math: results must match SDPA). The build lives
in the omni cache dir, keyed by the source, the flags, torch's version and the machine
type, and is renamed into place whole, so concurrent engine processes never see half a
build. No compiler, a failed build or ``OMNI_CPU_ATTENTION=0``: a warning once, and the
engine keeps the SDPA path (kv_cache.decode_kernel); a request never fails for it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from omni.models.cache import build_once, default_cache_dir

log = logging.getLogger("omni.engines.ar.cpu_decode_kernel")

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")
HEADERS = (Path(__file__).with_name("cpu_lanes.h"),)  # what SOURCE includes by name
LIBRARY = "omni_cpu_paged_decode.so"
SWITCH = "OMNI_CPU_ATTENTION"  # "0": never build, keep the SDPA path
# Vector versions of the loops (cpu_paged_decode.cpp picks the widest the CPU runs; the
# AVX2 one is compiled through a target attribute, so the flags stay portable)
ISAS = {"baseline": 1, "avx2": 2}
# -fopenmp: at::parallel_for is OpenMP inlined into the source (torch's CPU backend); the
# library then shares torch's already-loaded libgomp and its thread count. GCC fuses
# multiply-adds in the AVX2 version: last-bit differences from the baseline version, as
# SDPA's own kernels have between CPUs (-ffp-contract=off made batch 32 15 % slower).
# -w: torch's headers warn under C++20.
FLAGS = ("-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp", "-w")
BUILD_TIMEOUT_S = 300
MAX_HEAD_DIM = 512  # kMaxDim of the source: its accumulator lives on the stack


def available() -> bool:
    """The operator is registered (building it on first call)."""
    return not unavailable_reason()


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str:
    """'' once the operator is loaded, else why it is not (logged once per process)."""
    reason = _load()
    if reason:
        log.warning("CPU paged decode kernel unavailable (%s): decode attention gathers "
                    "the cache and runs SDPA", reason)
    return reason


def _load() -> str:
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} not found; set CXX)"
    if _registered():
        return ""
    try:
        torch.ops.load_library(str(build(compiler, SOURCE) / LIBRARY))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"build failed: {str(exc)[-800:]}"
    return ""


def _registered() -> bool:
    try:
        torch.ops.omni_cpu.paged_decode  # noqa: B018 - raises until the library is loaded
    except (AttributeError, RuntimeError):
        return False
    return True


def build(compiler: str, source: Path) -> Path:
    """The directory holding the library built from `source`, compiling it if no build of
    the same key is there. One process compiles while the others of the host wait on a
    lock (an flock: a killed builder releases it)."""
    target = build_dir(compiler, source)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_once(target, lambda d: (d / LIBRARY).is_file(),
                          lambda tmp: _compile(compiler, source, tmp))


def build_dir(compiler: str, source: Path) -> Path:
    """Where the build of this source, flags, compiler, torch and machine type lives."""
    key = hashlib.sha256()
    for part in (source.read_bytes(), *(h.read_bytes() for h in HEADERS),
                 " ".join(FLAGS).encode(), compiler.encode(),
                 torch.__version__.encode(), platform.machine().encode()):
        key.update(part)
    return default_cache_dir() / "kernels" / f"cpu_paged_decode-{key.hexdigest()[:16]}"


def _compile(compiler: str, source: Path, out: Path) -> None:
    from torch.utils.cpp_extension import include_paths, library_paths

    for path in (source, *HEADERS):
        shutil.copy(path, out / path.name)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [compiler, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               *(f"-I{p}" for p in include_paths()), str(out / source.name),
               *(f"-L{p}" for p in library_paths()), "-lc10", "-ltorch_cpu",
               "-o", str(out / LIBRARY)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{compiler} exited {done.returncode}: {done.stderr[-800:]}")


def force_isa(name: str | None) -> None:
    """Run one vector version of the loops (ISAS; None: the widest again): tests compare
    each version this CPU runs. RuntimeError if the CPU lacks it."""
    torch.ops.omni_cpu.set_isa(ISAS[name] if name else 0)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, lens: torch.Tensor, scale: float | None,
                 window: int) -> torch.Tensor:
    """q (H, B, D) one query per sequence; k/v_cache (slots, KVH, D); slots (B, W) each
    sequence's context slots in order (never read past lens[b]); lens (B,); window 0 =
    none. Returns (B, H, D) like the SDPA path."""
    heads, batch, dim = q.shape
    q = q if q.stride(2) == 1 else q.contiguous()
    out = q.new_empty(batch, heads, dim)
    scale = dim ** -0.5 if scale is None else scale
    torch.ops.omni_cpu.paged_decode(q, k_cache, v_cache, slots, lens, float(scale),
                                    int(window or 0), out)
    return out
