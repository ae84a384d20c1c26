"""CUDA kernels for pre- and post-processing and the paged KV cache, each with a NumPy twin.

The twins (imported here) run anywhere; `tensord.kernels.gpu` launches the kernels on a
device, compiled with NVRTC (`compiler`), cached on disk (`cache`) and loaded with the
driver API (`driver`).
"""

from tensord.kernels.classify import softmax_topk
from tensord.kernels.image import Normalisation, letterbox, letterbox_geometry, resize_normalize
from tensord.kernels.kv import kv_gather, kv_scatter
from tensord.kernels.nms import NmsSettings, nms

__all__ = [
    "NmsSettings",
    "Normalisation",
    "kv_gather",
    "kv_scatter",
    "letterbox",
    "letterbox_geometry",
    "nms",
    "resize_normalize",
    "softmax_topk",
]
