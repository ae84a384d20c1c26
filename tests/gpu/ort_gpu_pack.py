"""Repack the onnxruntime-gpu wheel to what its CUDA provider needs, in carriable parts.

    python -m tests.gpu.ort_gpu_pack WHEEL OUT_DIR [--archs 90] [--part-max-mib 56]

`make gpu-ort-pack` runs it. From the wheel it keeps the `onnxruntime` package as
`import onnxruntime` loads it (the Python files of the package and of capi/, the pybind
module, libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so) and its
dist-info, with a new RECORD. It leaves out what the CUDA provider never loads: the
TensorRT provider, libonnxruntime.so (the C API library; the Python module has its own
copy of the runtime), and the tools, transformers, quantization, backend and datasets
folders. With --archs it keeps, in the CUDA provider's fat binaries, only the kernels of
those SM architectures (tests/gpu/ort_gpu_fatbin.py; `all` keeps every one). The
libraries carry no debug symbols: strip would save a few hundred bytes, so they are left
as built.

OUT_DIR gets NAME.tar.xz split in equal parts NAME.tar.xz.part-00, -01, ... of at most
--part-max-mib MiB, and SHA256SUMS (each part, then the whole archive), for
tests/gpu/ort-gpu-install.sh on the GPU host; it prints the figures, among them how many
calls of at most 64 MiB carry the parts beside the work tree.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import math
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from tests.gpu.ort_gpu_fatbin import prune_library

CALL_LIMIT = 64 * 2**20  # what one call to the GPU host may carry, the work tree included
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
LEFT_OUT = (
    "onnxruntime/tools/*",
    "onnxruntime/transformers/*",
    "onnxruntime/quantization/*",
    "onnxruntime/backend/*",
    "onnxruntime/datasets/*",
    "onnxruntime/capi/libonnxruntime_providers_tensorrt.so",
    "onnxruntime/capi/libonnxruntime.so*",
    "*.dist-info/RECORD",
    "*.dist-info/entry_points.txt",  # its one script runs onnxruntime.tools
)
REQUIRED = (
    "onnxruntime/__init__.py",
    "onnxruntime/capi/_pybind_state.py",
    "onnxruntime/capi/onnxruntime_pybind11_state.*.so",
    "onnxruntime/capi/libonnxruntime_providers_shared.so",
    CUDA_PROVIDER,
)


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB ({size:,} bytes)"


def unpack(wheel: Path, stage: Path) -> tuple[list[str], int]:
    """Extract what is kept into `stage`; (the names kept, the bytes left out)."""
    kept: list[str] = []
    left_out = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if any(fnmatch.fnmatch(info.filename, pattern) for pattern in LEFT_OUT):
                left_out += info.file_size
                continue
            target = Path(archive.extract(info, stage))
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode or 0o644)
            kept.append(info.filename)
    for pattern in REQUIRED:
        if not any(fnmatch.fnmatch(name, pattern) for name in kept):
            raise SystemExit(f"{wheel.name} has no {pattern}: not an onnxruntime-gpu wheel?")
    return sorted(kept), left_out


def write_record(stage: Path, kept: list[str]) -> str:
    """A RECORD for the files kept (pip and importlib.metadata read it); its name."""
    dist_info = next(name.split("/")[0] for name in kept if ".dist-info/" in name)
    record = f"{dist_info}/RECORD"
    lines = []
    for name in kept:
        data = (stage / name).read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    (stage / record).write_text("\n".join(lines) + "\n")
    return record


def make_tar(stage: Path, names: list[str], tar_path: Path) -> None:
    """An uncompressed tar of `names`, the same bytes for the same files."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(names):
            info = tar.gettarinfo(stage / name, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with (stage / name).open("rb") as data:
                tar.addfile(info, data)


def compress(tar_path: Path) -> Path:
    """tar_path as .tar.xz at xz's strongest preset: a little smaller than zstd --ultra -22
    makes it, and the GPU host unpacks it with Python's lzma alone."""
    out = tar_path.with_suffix(".tar.xz")
    if shutil.which("xz"):
        # One block, one thread: the archive is a little smaller than xz -T0's blocks make it.
        subprocess.run(["xz", "-9e", "-T1", "-k", "-f", str(tar_path)], check=True)
    else:
        import lzma

        preset = 9 | lzma.PRESET_EXTREME
        with tar_path.open("rb") as src, lzma.open(out, "wb", preset=preset) as dst:
            shutil.copyfileobj(src, dst, 2**20)
    return out


def split(archive: Path, out: Path, part_max: int) -> list[Path]:
    """Equal parts of at most part_max bytes, and SHA256SUMS (the parts, then the whole)."""
    size = archive.stat().st_size
    count = math.ceil(size / part_max)
    part_size = math.ceil(size / count)
    parts = []
    sums = []
    with archive.open("rb") as src:
        for index in range(count):
            part = out / f"{archive.name}.part-{index:02d}"
            data = src.read(part_size)
            part.write_bytes(data)
            parts.append(part)
            sums.append(f"{hashlib.sha256(data).hexdigest()}  {part.name}")
    whole = hashlib.sha256()
    with archive.open("rb") as src:
        for block in iter(lambda: src.read(2**20), b""):
            whole.update(block)
    sums.append(f"{whole.hexdigest()}  {archive.name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return parts


def work_tree_bytes(repo: Path) -> int:
    """What a call carries of the work tree: the files git tracks or would track."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    paths = (repo / name.decode() for name in listed if name)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def calls_needed(parts: int, part_size: int, fixed: int, last_extra: int = 0) -> int:
    """How many calls of at most 64 MiB carry `parts` parts when each call also carries
    `fixed` bytes (the work tree, SHA256SUMS) and the last one `last_extra` more; 0: none can."""
    per_call = (CALL_LIMIT - fixed) // part_size
    in_last = min(parts, (CALL_LIMIT - fixed - last_extra) // part_size)
    if per_call < 1 or in_last < 0:
        return 0
    return 1 + math.ceil((parts - in_last) / per_call)


def repack(wheel: Path, out: Path, archs: str) -> tuple[Path, int, int]:
    """NAME.tar.xz in `out` from the wheel; (its path, the bytes and the files it holds)."""
    stage = out / "stage"
    shutil.rmtree(out, ignore_errors=True)
    stage.mkdir(parents=True)
    kept, left_out = unpack(wheel, stage)
    print(f"left out {mib(left_out)}: {', '.join(LEFT_OUT)}")
    if archs != "all":
        report = prune_library(stage / CUDA_PROVIDER, frozenset(int(a) for a in archs.split(",")))
        print(f"{CUDA_PROVIDER}: {report.summary()}")
    kept.append(write_record(stage, kept))
    repacked = sum((stage / name).stat().st_size for name in kept)
    dist, version, python_tag = wheel.name.split("-")[:3]
    suffix = "" if archs == "all" else "-sm" + archs.replace(",", "-sm")
    tar_path = out / f"{dist}-{version}-{python_tag}{suffix}.tar"
    make_tar(stage, kept, tar_path)
    shutil.rmtree(stage)
    archive = compress(tar_path)
    tar_path.unlink()
    return archive, repacked, len(kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--archs", default="90", help="SM architectures kept (90,100), or all")
    parser.add_argument("--part-max-mib", type=float, default=56.0)
    parser.add_argument("--gpu-wheels", type=Path, default=Path("build/gpu-wheels"))
    args = parser.parse_args(argv)

    archive, repacked, files = repack(args.wheel, args.out, args.archs)
    compressed = archive.stat().st_size
    parts = split(archive, args.out, int(args.part_max_mib * 2**20))
    archive.unlink()
    part_size = max(p.stat().st_size for p in parts)
    fixed = work_tree_bytes(Path(__file__).resolve().parents[2]) + 4096  # 4096: SHA256SUMS
    calls = calls_needed(len(parts), part_size, fixed)
    if not calls:
        raise SystemExit(f"a part ({mib(part_size)}) and the work tree pass 64 MiB")
    lines = [
        f"{args.out}: {args.wheel.name} repacked for the CUDA provider",
        f"  wheel                  {mib(args.wheel.stat().st_size)}",
        f"  repacked, uncompressed {mib(repacked)} in {files} files",
        f"  compressed (tar.xz)    {mib(compressed)}",
        f"  parts                  {len(parts)} of {mib(part_size)} at most",
        f"  calls to carry them    {calls} (each with SHA256SUMS and the "
        f"{fixed / 2**20:.1f} MiB work tree, 64 MiB a call)",
    ]
    if args.gpu_wheels.is_dir():
        wheels = sum(p.stat().st_size for p in args.gpu_wheels.glob("*.whl"))
        with_wheels = calls_needed(len(parts), part_size, fixed, wheels)
        lines.append(
            f"  calls with gpu-wheels  {with_wheels or 'none can'} (the last also carries "
            f"{args.gpu_wheels}, {wheels / 2**20:.1f} MiB)"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
