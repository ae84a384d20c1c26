"""The onnxruntime-gpu repack for the offline GPU host (tests/gpu/ort_gpu_pack.py,
ort_gpu_fatbin.py), on fat binaries and ELF files built here byte by byte."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.ort_gpu_fatbin import containers, prune, prune_library, section_span
from tests.gpu.ort_gpu_pack import calls_needed

MIB = 2**20


def entry(arch: int, payload: bytes, kind: int = 2) -> bytes:
    """A 64-byte entry header (kind, attributes, header size, padded size, payload size,
    arch at 28) and its payload padded to 8 bytes."""
    padded = payload + bytes(-len(payload) % 8)
    header = bytearray(64)
    struct.pack_into("<HHIQI", header, 0, kind, 0x0101, 64, len(padded), len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + padded


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


SM80 = entry(80, b"eighty-payload")  # 14 bytes, padded to 16
SM90 = entry(90, b"ninety")  # 6, padded to 8
SM120 = entry(120, b"one-twenty!")  # 11, padded to 16


def test_prune_keeps_the_architectures_asked_for_in_place() -> None:
    multi = fatbin(SM80, SM90)
    only_120 = fatbin(SM120)
    section = bytearray(multi + bytes(8) + only_120)
    original = bytes(section)

    report = prune(section, frozenset({90}))

    assert len(section) == len(original)
    assert section[: 16 + len(SM90)] == fatbin(SM90)
    assert section[16 + len(SM90) : len(multi) + 8] == bytes(len(SM80) + 8)
    assert section[len(multi) + 8 :] == only_120  # nothing for sm_90 in it: left whole
    assert (report.containers, report.rewritten) == (2, 1)
    assert report.kept == {"sm_90": 72, "sm_120": 80}
    assert report.dropped == {"sm_80": 80}
    assert [[e.arch for e in c.entries] for c in containers(section)] == [[90], [120]]


def test_prune_leaves_a_fatbin_with_only_kept_entries_as_it_was() -> None:
    section = bytearray(fatbin(SM90, entry(90, b"ptx", kind=1)))
    before = bytes(section)
    report = prune(section, frozenset({90}))
    assert bytes(section) == before
    assert (report.rewritten, report.kept) == (0, {"sm_90": 72, "ptx_90": 72})


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (fatbin(SM90) + b"\x01", "no fat binary at 0x58"),
        (
            fatbin(SM90)[:-8].replace(struct.pack("<Q", 72), struct.pack("<Q", 64), 1),
            "does not fit its fat binary",
        ),
        (fatbin(SM90) + bytes(8) + fatbin(SM90)[:20], "runs past the section"),
    ],
)
def test_anything_but_fat_binaries_is_refused(section: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prune(bytearray(section), frozenset({90}))


def elf_with(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF file: the header, each section's bytes, .shstrtab and
    the section headers (the null one first)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body = bytearray(64)
    headers = [bytes(64)]
    for name, data in [*sections.items(), (".shstrtab", names)]:
        name_at = names.index(name.encode() + b"\0")
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, 1, 2, 0, len(body), len(data),
                                   0, 0, 8, 0))  # fmt: skip
        body += data
    shoff = len(body)
    body[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
    struct.pack_into("<Q", body, 0x28, shoff)
    struct.pack_into("<HHH", body, 0x3A, 64, len(headers), len(headers) - 1)
    return bytes(body) + b"".join(headers)


def test_prune_library_rewrites_the_nv_fatbin_section_alone(tmp_path: Path) -> None:
    text = b"\x90" * 40
    library = tmp_path / "libprovider.so"
    library.write_bytes(elf_with({".text": text, ".nv_fatbin": fatbin(SM80, SM90)}))
    before = library.read_bytes()
    offset, size = section_span(before, ".nv_fatbin")
    assert (offset, size) == (64 + len(text), 16 + len(SM80) + len(SM90))

    prune_library(library, frozenset({90}))

    after = library.read_bytes()
    assert after[:offset] == before[:offset]
    assert after[offset + size :] == before[offset + size :]
    assert after[offset : offset + size] == fatbin(SM90) + bytes(len(SM80))


def test_section_span_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"no \.nv_fatbin section"):
        section_span(elf_with({".text": b"\0"}), ".nv_fatbin")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        section_span(b"MZ" + bytes(62), ".nv_fatbin")


@pytest.mark.parametrize(
    ("parts", "part_size", "fixed", "last_extra", "calls"),
    [
        (2, 29 * MIB, 3 * MIB, 0, 1),  # both parts in one call
        (2, 29 * MIB, 3 * MIB, 13 * MIB, 2),  # the wheels push one part out
        (1, 55 * MIB, 3 * MIB, 13 * MIB, 2),  # the last call carries the wheels alone
        (5, 56 * MIB, 3 * MIB, 0, 5),
        (1, 62 * MIB, 3 * MIB, 0, 0),  # a part and the tree pass 64 MiB
    ],
)
def test_calls_needed(parts: int, part_size: int, fixed: int, last_extra: int, calls: int) -> None:
    assert calls_needed(parts, part_size, fixed, last_extra) == calls


ROOT = Path(__file__).resolve().parents[3]
FAKE_ORT = '''\
"""A stand-in for onnxruntime-gpu whose CUDA provider never loads, as on a host without
the CUDA libraries: sessions fall back to the CPU."""
__version__ = "1.31.1"
def get_device():
    return "GPU"
def preload_dlls(cuda=True, cudnn=True, msvc=True, directory=None):
    print("Failed to load libcublasLt.so.13: not on this host")
class InferenceSession:
    def __init__(self, model, sess_options=None, providers=None):
        pass
    def get_providers(self):
        return ["CPUExecutionProvider"]
'''


def fake_ort_gpu_wheel(folder: Path) -> Path:
    """A wheel laid out as onnxruntime-gpu's, with a CUDA provider whose fat binaries
    hold sm_80 and sm_90 kernels (random bytes: xz cannot shrink them)."""
    import zipfile

    provider = elf_with({".text": b"\x90" * 64, ".nv_fatbin": fatbin(
        entry(80, os.urandom(6000)), entry(90, os.urandom(6000)))})  # fmt: skip
    files = {
        "onnxruntime/__init__.py": FAKE_ORT.encode(),
        "onnxruntime/capi/_pybind_state.py": b"",
        "onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu.so": b"\0",
        "onnxruntime/capi/libonnxruntime_providers_shared.so": b"\0",
        "onnxruntime/capi/libonnxruntime_providers_cuda.so": provider,
        "onnxruntime/capi/libonnxruntime_providers_tensorrt.so": os.urandom(4000),
        "onnxruntime/capi/libonnxruntime.so.1.31.1": os.urandom(4000),
        "onnxruntime/tools/convert.py": b"",
        "onnxruntime_gpu-1.31.1.dist-info/METADATA": b"Name: onnxruntime-gpu\nVersion: 1.31.1\n",
        "onnxruntime_gpu-1.31.1.dist-info/RECORD": b"",
    }
    wheel = folder / "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_the_pack_travels_in_checked_parts_and_a_cpu_fallback_fails(tmp_path: Path) -> None:
    """Pack, carry the parts over three runs (one of them corrupt), unpack; a session that
    fell back to the CPU fails the install (exit 4), saying so."""
    out, dest = tmp_path / "parts", tmp_path / "dest"
    nvidia = tmp_path / "venv-nvidia"
    (nvidia / "cu13" / "lib").mkdir(parents=True)
    packed = subprocess.run(
        [sys.executable, "-m", "tests.gpu.ort_gpu_pack", str(fake_ort_gpu_wheel(tmp_path)),
         str(out), "--archs", "90", "--part-max-mib", str(2600 / MIB)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    pieces = sorted(p.name for p in out.glob("*.part-*"))
    assert pieces[0] == "onnxruntime_gpu-1.31.1-cp312-sm90.tar.xz.part-00"
    assert len(pieces) == 3, packed.stdout
    assert "parts                  3 of " in packed.stdout

    def install(*names: str) -> subprocess.CompletedProcess[str]:
        carried = tmp_path / "carried"
        shutil.rmtree(carried, ignore_errors=True)
        carried.mkdir()
        for name in ("SHA256SUMS", *names):
            shutil.copy(out / name, carried)
        env = {**os.environ, "TENSORD_ORT_GPU_DIR": str(dest), "PYTHON": sys.executable,
               "TENSORD_NVIDIA_DIR": str(nvidia)}  # fmt: skip
        return subprocess.run(
            ["bash", "tests/gpu/ort-gpu-install.sh", str(carried)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    first = install(pieces[0])
    assert first.returncode == 3, first.stdout + first.stderr
    assert f"kept 1 of 3 parts; still missing: {pieces[1]} {pieces[2]}" in first.stdout
    good = (out / pieces[1]).read_bytes()
    (out / pieces[1]).write_bytes(b"x" + good[1:])
    bad = install(pieces[1])
    assert bad.returncode == 1 and f"{pieces[1]}: sha256 " in bad.stderr
    (out / pieces[1]).write_bytes(good)
    done = install(pieces[1], pieces[2])
    assert done.returncode == 4, done.stdout + done.stderr
    assert "the session fell back to ['CPUExecutionProvider']" in done.stderr

    site = dest / "site"
    assert (site / "nvidia").resolve() == nvidia.resolve()
    capi = site / "onnxruntime" / "capi"
    assert sorted(p.name for p in capi.iterdir() if p.suffix == ".so" or ".so." in p.name) == [
        "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so",
        "onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu.so",
    ]  # fmt: skip
    assert not (site / "onnxruntime" / "tools").exists()
    elf = (capi / "libonnxruntime_providers_cuda.so").read_bytes()
    offset, size = section_span(elf, ".nv_fatbin")
    assert [[e.arch for e in c.entries] for c in containers(elf[offset : offset + size])] == [[90]]
    again = install()  # nothing carried: it goes straight to the check
    assert again.returncode == 4 and "is already unpacked" in again.stdout
