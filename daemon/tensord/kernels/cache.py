"""Compiled kernels cached on disk, keyed by source hash, NVRTC version and architecture.

Files live in `<cache_directory>/kernels/<family>-<arch>-nvrtc<M.m>-<hash>.cubin`. The
hash covers the family's source, every header, the compile options and the NVRTC version,
so an edited kernel or a new NVRTC never loads a stale binary. Writes go to a temporary
file and are renamed into place, so a crash never leaves a truncated entry.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import structlog

from tensord.files import write_atomically
from tensord.kernels.compiler import COMPILE_OPTIONS, compile_cubin, nvrtc_version
from tensord.kernels.sources import SourceBundle, load_source

log = structlog.get_logger("tensord.kernels")


@dataclass(slots=True, frozen=True)
class CachedKernel:
    """A family's CUBIN for one architecture, and whether it came from the cache."""

    family: str
    arch: str
    cubin: bytes
    path: Path
    from_cache: bool


def cache_key(bundle: SourceBundle, arch: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    """Hex digest of everything that determines the CUBIN."""
    major, minor = nvrtc_version()
    digest = hashlib.sha256()
    for part in (bundle.source, *(name.encode() + b"\0" + text for name, text in bundle.headers)):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    digest.update(f"{arch}|nvrtc {major}.{minor}|{' '.join(options)}".encode())
    return digest.hexdigest()


def cache_path(directory: Path, bundle: SourceBundle, arch: str) -> Path:
    """The cache file for a family and architecture."""
    major, minor = nvrtc_version()
    key = cache_key(bundle, arch)[:24]
    return directory / "kernels" / f"{bundle.family.name}-{arch}-nvrtc{major}.{minor}-{key}.cubin"


_ELF_MAGIC = b"\x7fELF"


def cached_cubin(family: str, arch: str, directory: Path, *, refresh: bool = False) -> CachedKernel:
    """The family's CUBIN for `arch`: read from the cache, or compiled and stored. With
    `refresh`, or when the cached file is not an ELF image, it is compiled anew."""
    bundle = load_source(family)
    path = cache_path(directory, bundle, arch)
    data = b""
    if not refresh:
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
    if data.startswith(_ELF_MAGIC):
        return CachedKernel(family, arch, data, path, True)
    compiled = compile_cubin(bundle, arch)
    if compiled.log:
        log.info("kernels.compile_log", family=family, arch=arch, log=compiled.log)
    _store(path, compiled.cubin)
    log.info(
        "kernels.compiled", family=family, arch=arch, path=str(path), bytes=len(compiled.cubin)
    )
    return CachedKernel(family, arch, compiled.cubin, path, False)


def forget(entry: CachedKernel) -> None:
    """Drop a cache entry the driver refused, so the next load recompiles it (a read-only
    cache keeps it: the caller compiles anew with refresh=True either way)."""
    try:
        entry.path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("kernels.cache_unwritable", path=str(entry.path), error=str(exc))


def _store(path: Path, data: bytes) -> None:
    try:
        write_atomically(path, data)
    except OSError as exc:  # a read-only cache costs a compile per start, nothing more
        log.warning("kernels.cache_unwritable", path=str(path), error=str(exc))
