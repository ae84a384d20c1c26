"""Keep only the GPU architectures a host runs in a shared library's CUDA fat binaries.

nvcc puts one fat binary per translation unit in the `.nv_fatbin` section: a 16-byte
header (magic 0xBA55ED50, version 1, header size 16, size of what follows), then entries,
each a header (kind, header size, padded payload size, payload size, SM architecture, ...)
and its payload (a cubin, or PTX). The CUDA driver reads the headers and loads the entry
that matches the device when a module is first used.

`prune` rewrites each fat binary in place with only the entries of the architectures kept
and zeroes the bytes it freed. Every offset and size in the ELF file stays as it was, so
the host code's pointers to each fat binary still hold, and the zeros cost nothing once
compressed. A fat binary with no entry for a kept architecture is left whole: its kernels
cannot run on such a device anyway, and the library registers it as before.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_MIN = 64  # an entry header: kind, attributes, header size, padded size, ... arch at 28
KIND_PTX = 1
KIND_ELF = 2


@dataclass(slots=True)
class Entry:
    """One entry of a fat binary: where it starts, its header and padded payload sizes."""

    offset: int
    size: int
    kind: int
    arch: int


@dataclass(slots=True)
class Container:
    """One fat binary: its offset in the section, its header size and its entries."""

    offset: int
    header_size: int
    end: int
    entries: list[Entry]


@dataclass(slots=True)
class PruneReport:
    """What `prune` found and did; the byte counts are entry headers plus payloads."""

    containers: int = 0
    rewritten: int = 0
    kept: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        def arches(counts: Counter[str]) -> str:
            return ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(counts.items()))

        return (
            f"{self.containers} fat binaries, {self.rewritten} rewritten; kept {arches(self.kept)}"
            f"; zeroed {arches(self.dropped) or 'nothing'}"
        )


def _label(entry: Entry) -> str:
    kind = {KIND_PTX: "ptx", KIND_ELF: "sm"}.get(entry.kind, f"kind{entry.kind}-")
    return f"{kind}_{entry.arch}"


def containers(section: bytes | bytearray) -> list[Container]:
    """Every fat binary in a `.nv_fatbin` section; ValueError on anything else in it."""
    found = []
    magic_bytes = struct.pack("<I", FATBIN_MAGIC)
    pos = 0
    while pos < len(section):
        nxt = section.find(magic_bytes, pos)
        gap_end = len(section) if nxt < 0 else nxt
        if section.count(0, pos, gap_end) != gap_end - pos:  # zeros: alignment, freed bytes
            raise ValueError(f"no fat binary at {pos:#x}")
        if nxt < 0:
            break
        pos = nxt
        if pos + CONTAINER_HEADER.size > len(section):
            raise ValueError(f"a truncated fat binary header at {pos:#x}")
        magic, _version, header_size, size = CONTAINER_HEADER.unpack_from(section, pos)
        if magic != FATBIN_MAGIC or header_size < CONTAINER_HEADER.size:
            raise ValueError(f"no fat binary at {pos:#x} (magic {magic:#x})")
        end = pos + header_size + size
        if end > len(section):
            raise ValueError(f"the fat binary at {pos:#x} runs past the section")
        found.append(Container(pos, header_size, end, _entries(section, pos + header_size, end)))
        pos = end
    return found


def _entries(section: bytes | bytearray, pos: int, end: int) -> list[Entry]:
    entries = []
    while pos < end:
        kind, _attr, header_size, padded = struct.unpack_from("<HHIQ", section, pos)
        (arch,) = struct.unpack_from("<I", section, pos + 28)
        size = header_size + padded
        if header_size < ENTRY_MIN or pos + size > end:
            raise ValueError(f"a fat binary entry at {pos:#x} does not fit its fat binary")
        entries.append(Entry(pos, size, kind, arch))
        pos += size
    return entries


def prune(section: bytearray, keep: frozenset[int]) -> PruneReport:
    """Keep only the entries whose SM architecture is in `keep`, in place (see above)."""
    report = PruneReport()
    for container in containers(section):
        report.containers += 1
        wanted = [e for e in container.entries if e.arch in keep]
        if not wanted:
            for e in container.entries:
                report.kept[_label(e)] += e.size
            continue
        body = b"".join(bytes(section[e.offset : e.offset + e.size]) for e in wanted)
        for e in container.entries:
            (report.kept if e.arch in keep else report.dropped)[_label(e)] += e.size
        if len(wanted) == len(container.entries):
            continue
        start = container.offset
        struct.pack_into("<Q", section, start + 8, len(body))
        body_at = start + container.header_size
        section[body_at : body_at + len(body)] = body
        section[body_at + len(body) : container.end] = bytes(container.end - body_at - len(body))
        report.rewritten += 1
    return report


def section_span(elf: bytes | bytearray, name: str) -> tuple[int, int]:
    """(file offset, size) of a section of a 64-bit little-endian ELF file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def header(index: int) -> tuple[int, int, int, int]:
        name_at, kind, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", elf, shoff + index * shentsize
        )
        return name_at, kind, offset, size

    strings_at = header(shstrndx)[2]
    for index in range(shnum):
        name_at, kind, offset, size = header(index)
        start = strings_at + name_at
        if elf[start : elf.index(b"\0", start)] == name.encode():
            if kind == 8:  # SHT_NOBITS: nothing in the file
                raise ValueError(f"{name} has no bytes in the file")
            return offset, size
    raise ValueError(f"no {name} section")


def prune_library(path: Path, keep: frozenset[int]) -> PruneReport:
    """Prune the `.nv_fatbin` section of the shared library at `path`, rewriting the file."""
    elf = bytearray(path.read_bytes())
    offset, size = section_span(elf, ".nv_fatbin")
    section = elf[offset : offset + size]
    report = prune(section, keep)
    containers(section)  # the result must read back as fat binaries
    elf[offset : offset + size] = section
    path.write_bytes(elf)
    return report
