"""[preprocess]/[postprocess] in model.toml: documented defaults, errors that name the
field, and plans checked against the model's signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensord.backends.base import TensorSpec
from tensord.dtypes import DType
from tensord.errors import ModelLoadError
from tensord.modelconfig.model import read_model_config
from tensord.modelconfig.processing import NmsConfig, PreprocessConfig, TopKConfig
from tensord.processing.plan import plan_processing

F32, F16 = DType.FLOAT32, DType.FLOAT16
PIXELS = [TensorSpec("pixels", F32, (-1, 3, 224, 224))]
LOGITS = [TensorSpec("logits", F32, (-1, 1000))]


def config_of(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "model.toml").write_text(text)
    return read_model_config(tmp_path)


def test_sections_parse_with_defaults(tmp_path: Path) -> None:
    config = config_of(tmp_path, '[preprocess]\n[postprocess]\nkind = "topk"\n')
    assert config.preprocess == PreprocessConfig()
    assert config.preprocess.kind == "resize" and config.preprocess.std == [1.0, 1.0, 1.0]
    assert config.postprocess == TopKConfig(kind="topk", k=5, softmax=True)
    nms = config_of(tmp_path, '[postprocess]\nkind = "nms"\n').postprocess
    assert isinstance(nms, NmsConfig) and nms.max_detections == 100 and nms.iou_threshold == 0.45


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[preprocess]\nstd = [1, 0, 1]", "preprocess.std: std values must be at"),
        ("[preprocess]\nstd = [1, 1e-46, 1]", "std values must be at least 1e-30"),
        ("[preprocess]\nstd = [1, inf, 1]", "preprocess.std: needs finite numbers"),
        ("[preprocess]\nmean = [nan, 0, 0]", "preprocess.mean: needs finite numbers"),
        ('[preprocess]\nkind = "letterbox"\npad_value = nan', "preprocess.pad_value"),
        ('[postprocess]\nkind = "nms"\nscore_threshold = nan', "postprocess.nms.score_threshold"),
        ("[preprocess]\nmean = [1, 2]", "preprocess.mean: needs 3 values"),
        ("[preprocess]\npad_value = 0", 'pad_value applies only to kind = "letterbox"'),
        ('[preprocess]\nkind = "crop"', "preprocess.kind: expected 'resize' or 'letterbox'"),
        ("[preprocess]\nsize = [224]", "size is [height, width]"),
        ('[preprocess]\ncolour = "rgb"', "preprocess.colour: unknown key"),
        ("[postprocess]\nk = 3", "postprocess: Unable to extract tag using discriminator 'kind'"),
        (
            '[postprocess]\nkind = "topk"\nk = 0',
            "postprocess.topk.k: expected a value greater than",
        ),
        ('[postprocess]\nkind = "nms"\nk = 3', "postprocess.nms.k: unknown key"),
        ('[postprocess]\nkind = "nms"\niou_threshold = 2', "postprocess.nms.iou_threshold"),
        ('[postprocess]\nkind = "nms"\nmax_detections = 4096', "postprocess.nms.max_detections"),
    ],
)
def test_bad_sections_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as caught:
        config_of(tmp_path, text + "\n")
    assert message in str(caught.value)


def test_plan_serves_images_and_top_k() -> None:
    plan = plan_processing(
        PreprocessConfig(name="image"), TopKConfig(kind="topk", k=3), PIXELS, LOGITS
    )
    assert plan is not None and plan.pre is not None
    assert plan.served_inputs == [TensorSpec("image", DType.UINT8, (-1, -1, -1, 3))]
    assert plan.served_outputs == [
        TensorSpec("classes", DType.INT32, (-1, 3)),
        TensorSpec("scores", F32, (-1, 3)),
    ]
    assert (plan.pre.height, plan.pre.width, plan.pre.dtype.name) == (224, 224, "float32")
    assert plan.model_outputs_for(["scores"]) == ["logits"]
    assert plan_processing(None, None, PIXELS, LOGITS) is None


def test_plan_nhwc_float16_and_size() -> None:
    spec = [TensorSpec("x", F16, (1, -1, -1, 3))]
    plan = plan_processing(PreprocessConfig(layout="nhwc", size=[96, 128]), None, spec, LOGITS)
    assert plan is not None and plan.pre is not None
    assert plan.pre.model_shape(1) == (1, 96, 128, 3) and plan.pre.dtype.name == "float16"
    assert plan.served_inputs == [TensorSpec("x", DType.UINT8, (1, -1, -1, 3))]
    assert plan.served_outputs == LOGITS and plan.passthrough == {"logits"}


@pytest.mark.parametrize(
    ("pre", "post", "inputs", "outputs", "message"),
    [
        (PreprocessConfig(), None, [TensorSpec("x", DType.UINT8, (-1, 3, 8, 8))], LOGITS,
         "needs a float32 or float16 input of rank 4"),
        (PreprocessConfig(), None, [TensorSpec("x", F32, (-1, 3, -1, -1))], LOGITS,
         "its height and width are dynamic; set preprocess.size"),
        (PreprocessConfig(), None, [TensorSpec("x", F32, (-1, 1, 8, 8))], LOGITS,
         "the NCHW channel dimension must be 3"),
        (PreprocessConfig(input="image"), None, PIXELS, LOGITS,
         "preprocess.input: the model has no input 'image'; it has ['pixels']"),
        (PreprocessConfig(), None, [*PIXELS, TensorSpec("y", F32, (-1, 3, 8, 8))], LOGITS,
         "preprocess.input: the model has 2 inputs ['pixels', 'y']; name one"),
        (PreprocessConfig(size=[100, 100]), None, PIXELS, LOGITS, "does not match"),
        (None, TopKConfig(kind="topk", k=11), PIXELS, [TensorSpec("p", F32, (-1, 10))],
         "k = 11 exceeds its 10 classes"),
        (None, TopKConfig(kind="topk"), PIXELS, [TensorSpec("p", F32, (-1, 2, 5))],
         "top-k needs a float32 or float16 [N, classes] output"),
        (None, NmsConfig(kind="nms"), PIXELS, LOGITS,
         "postprocess.boxes: the model has no output 'boxes'"),
        (None, NmsConfig(kind="nms", scores="logits"), PIXELS,
         [TensorSpec("boxes", F32, (-1, 100, 4)), TensorSpec("logits", F32, (-1, 100))],
         "NMS needs float32 boxes [N, B, 4] and scores [N, B, classes]"),
        (None, TopKConfig(kind="topk", output="logits"), PIXELS,
         [*LOGITS, TensorSpec("classes", F32, (-1, 1))],
         "the model's output(s) ['classes'] clash with the processed outputs"),
        (PreprocessConfig(input="pixels", name="aux"), None,
         [*PIXELS, TensorSpec("aux", F32, (-1, 4))], LOGITS,
         "preprocess.name 'aux' is another input of the model"),
        (None, NmsConfig(kind="nms"), PIXELS,
         [TensorSpec("boxes", F32, (-1, 100, 4)), TensorSpec("scores", F32, (-1, 50, 80))],
         "disagree on the number of boxes (dimension 1)"),
    ],
)  # fmt: skip
def test_plan_errors_name_the_mismatch(pre, post, inputs, outputs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelLoadError) as caught:
        plan_processing(pre, post, inputs, outputs)
    assert message in str(caught.value)
