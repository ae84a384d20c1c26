"""The CUDA C sources in kernels/: where they are, and what each family exports.

An installed daemon finds them inside the package (`tensord/kernels/cuda/`, copied there
at build time by setup.py); a source checkout or an editable install reads the
repository's `kernels/` directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "cuda"
_CHECKOUT = Path(__file__).resolve().parents[3] / "kernels"


@dataclass(slots=True, frozen=True)
class KernelFamily:
    """One .cu file and the extern "C" kernels it defines."""

    name: str
    file: str
    functions: tuple[str, ...]


FAMILIES: dict[str, KernelFamily] = {
    family.name: family
    for family in (
        KernelFamily(
            "preprocess", "preprocess.cu", ("resize_normalize_f32", "resize_normalize_f16")
        ),
        KernelFamily("letterbox", "letterbox.cu", ("letterbox_f32", "letterbox_f16")),
        KernelFamily("softmax_topk", "softmax_topk.cu", ("softmax_topk_f32", "softmax_topk_f16")),
        KernelFamily("nms", "nms.cu", ("nms_per_class",)),
        KernelFamily(
            "kv_cache",
            "kv_cache.cu",
            tuple(f"kv_{op}_v{w}" for op in ("gather", "scatter") for w in (16, 8, 4, 2, 1)),
        ),
    )
}


@dataclass(slots=True, frozen=True)
class SourceBundle:
    """A family's source and every header it may include, as NVRTC takes them."""

    family: KernelFamily
    source: bytes
    headers: tuple[tuple[str, bytes], ...]


def source_dir() -> Path:
    """The directory holding the .cu files: packaged copy first, then the checkout."""
    for candidate in (_PACKAGED, _CHECKOUT):
        if (candidate / "preprocess.cu").is_file():
            return candidate
    raise FileNotFoundError(
        f"the CUDA kernel sources are missing: looked in {_PACKAGED} and {_CHECKOUT}; "
        "reinstall tensord (pip install .) so that its kernels/ files are packaged"
    )


@cache
def load_source(name: str) -> SourceBundle:
    """The source of family `name` with the headers beside it."""
    family = FAMILIES[name]
    directory = source_dir()
    headers = tuple((p.name, p.read_bytes()) for p in sorted(directory.glob("*.cuh")))
    return SourceBundle(family, (directory / family.file).read_bytes(), headers)
