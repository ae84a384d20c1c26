"""What a decode step on KV slots moves between host and device, counted where it can move.

tensord's SlotRunner runs here over a `ProfiledSession`: ONNX Runtime's own session of the
same model with profiling on (SessionOptions.enable_profiling), whose io_binding() hands
out `RecordingBinding`s. A step's host <-> device traffic can only come from three places,
and each is counted:

  * inputs bound from host memory (bind_cpu_input: the token ids and the mask; or an
    address bound on the "cpu" device). ONNX Runtime's IOBinding copies such an input to
    the device of the nodes that read it when it is *bound* (IOBinding::BindInput, through
    utils::CopyOneInputAcrossDevices), outside the run and outside the profile: the
    recording binding counts their bytes;
  * outputs bound to host memory (the logits): copied back after the run, outside the
    profile too: counted from the OrtValues the binding holds after the run;
  * copies inside the run: the Memcpy nodes (MemcpyFromHost, MemcpyToHost) ONNX Runtime
    inserts where a value crosses between a node on the device and one on the CPU. They
    are node events of the profile, each with its output's size (args.output_size) and
    shape (args.output_type_shape); `read_profile` gives them per run.

Past and present are bound by address on the slots' device (SlotStorage). The checks
(`check_traffic`): no value of a KV slab's size crosses in any of the three places, the
GroupQueryAttention nodes run on the expected provider, and a step's bytes, the mask
aside (its width is the context: [rows, context + 1] int64, as every decoder's mask is),
are the same at every context and grow with the batch.

The profile is a JSON array of Chrome-trace events ("ph": "X"): "cat": "Session" events
(model_loading_uri, session_initialization, and one "model_run" per run, enclosing its
nodes) and "cat": "Node" events, one "<node name>_kernel_time" per node run, whose args
hold op_name, provider, output_size and output_type_shape ([{"float16": [8, 1, 2048]}]);
numbers in args are strings. A run's nodes are those whose ts lies within its model_run.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MEMCPY_OPS = frozenset({"MemcpyFromHost", "MemcpyToHost"})
ATTENTION_OP = "GroupQueryAttention"
MASK = "attention_mask"
_KV_PREFIXES = ("past_key_values.", "present.")
_ITEMSIZE = {
    "tensor(float16)": 2,
    "tensor(bfloat16)": 2,
    "tensor(float)": 4,
    "tensor(double)": 8,
    "tensor(int64)": 8,
    "tensor(int32)": 4,
    "tensor(bool)": 1,
    "tensor(uint8)": 1,
    "tensor(int8)": 1,
}


# -- the profile -----------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class NodeEvent:
    """One node's run, as the profile records it."""

    name: str
    op: str
    provider: str
    output_bytes: int
    output_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    """(element type, shape) of each output, e.g. ("int64", (8, 1001))."""


@dataclass(slots=True)
class RunProfile:
    """One session run (a "model_run" event) and the node events within it."""

    start_us: int
    dur_us: int
    nodes: list[NodeEvent] = field(default_factory=list)

    @property
    def memcpys(self) -> list[NodeEvent]:
        """The copies ONNX Runtime made inside this run (Memcpy nodes)."""
        return [node for node in self.nodes if node.op in MEMCPY_OPS]

    def providers(self, op: str) -> set[str]:
        """The providers the nodes of type `op` ran on in this run."""
        return {node.provider for node in self.nodes if node.op == op}


def _shapes(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    shapes = []
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, dict):
            for dtype, dims in entry.items():
                shapes.append((str(dtype), tuple(int(d) for d in dims)))
    return tuple(shapes)


def parse_profile(events: Any) -> list[RunProfile]:
    """The runs of a profile (its parsed JSON), in time order, each with its node events.
    A node event outside every run (none in ONNX Runtime's profiles) is left out."""
    if isinstance(events, dict):  # a trace object rather than a bare event array
        events = events.get("traceEvents", [])
    if not isinstance(events, list):
        raise ValueError(f"not an ONNX Runtime profile: a {type(events).__name__}")
    runs = sorted(
        (
            RunProfile(int(e["ts"]), int(e["dur"]))
            for e in events
            if e.get("cat") == "Session" and e.get("name") == "model_run"
        ),
        key=lambda run: run.start_us,
    )
    starts = [run.start_us for run in runs]
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue  # _fence_before/_fence_after events carry no sizes
        ts = int(event["ts"])
        index = bisect.bisect_right(starts, ts) - 1
        if index < 0 or ts > runs[index].start_us + runs[index].dur_us:
            continue
        args = event.get("args") or {}
        runs[index].nodes.append(
            NodeEvent(
                name=name.removesuffix("_kernel_time"),
                op=str(args.get("op_name", "")),
                provider=str(args.get("provider", "")),
                output_bytes=int(args.get("output_size", 0) or 0),
                output_shapes=_shapes(args.get("output_type_shape")),
            )
        )
    return runs


def read_profile(path: Path) -> list[RunProfile]:
    """parse_profile of the file InferenceSession.end_profiling() wrote."""
    return parse_profile(json.loads(Path(path).read_text()))


# -- the recording binding and the profiled session ------------------------------------


def _nbytes(dtype: Any, shape: Sequence[int]) -> int:
    return int(math.prod(int(d) for d in shape)) * np.dtype(dtype).itemsize


@dataclass(slots=True, frozen=True)
class Bound:
    """What one name is bound to."""

    name: str
    device: str
    ptr: int | None
    """The address bound (None: a host array, or an output ONNX Runtime allocates)."""
    nbytes: int | None
    """Bytes bound (None: an output ONNX Runtime sizes)."""


class RecordingBinding:
    """An ort.IOBinding that remembers what was bound and what was fed from the host."""

    def __init__(self, binding: Any) -> None:
        self.binding = binding
        self.inputs: dict[str, Bound] = {}
        self.outputs: dict[str, Bound] = {}
        """In the order of first binding: the order of get_outputs()."""
        self.fed: dict[str, int] = {}
        """Bytes bound from host memory since the last run, by input name."""

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self.binding.bind_cpu_input(name, array)
        self.inputs[name] = Bound(name, "cpu", None, array.nbytes)
        self.fed[name] = array.nbytes

    def bind_input(
        self, name: str, device: str, device_id: int, dtype: Any, shape: Sequence[int], ptr: int
    ) -> None:
        self.binding.bind_input(name, device, device_id, dtype, list(shape), ptr)
        size = _nbytes(dtype, shape)
        self.inputs[name] = Bound(name, device, int(ptr), size)
        if device == "cpu":
            self.fed[name] = size

    def bind_output(
        self,
        name: str,
        device: str = "cpu",
        device_id: int = 0,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        ptr: int | None = None,
    ) -> None:
        if ptr is None:
            self.binding.bind_output(name, device, device_id)
            bound = Bound(name, device, None, None)
        else:
            assert dtype is not None and shape is not None
            self.binding.bind_output(name, device, device_id, dtype, list(shape), ptr)
            bound = Bound(name, device, int(ptr), _nbytes(dtype, shape))
        self.outputs[name] = bound  # a name bound again keeps its place, as in ORT

    def get_outputs(self) -> Any:
        return self.binding.get_outputs()

    def output_values(self) -> dict[str, Any]:
        """The bound outputs' OrtValues by name (after a run)."""
        return dict(zip(self.outputs, self.binding.get_outputs(), strict=True))

    def take_fed(self) -> dict[str, int]:
        fed, self.fed = self.fed, {}
        return fed


def value_bytes(value: Any) -> int:
    """An OrtValue's bytes, from its type and shape."""
    return int(math.prod(value.shape())) * _ITEMSIZE[value.data_type()]


@dataclass(slots=True)
class RunRecord:
    """One run_binding: what was fed from and fetched to the host, the binding."""

    label: str
    fed: dict[str, int]
    fetched: dict[str, int]
    """Bytes of each output that came back to host memory."""
    binding: RecordingBinding


class ProfiledSession:
    """The SlotRunner's BoundSession over `session` (created with profiling on): each
    run_binding is recorded under the current `label`."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.label = ""
        self.runs: list[RunRecord] = []

    def io_binding(self) -> RecordingBinding:
        return RecordingBinding(self.session.io_binding())

    def run_binding(self, binding: RecordingBinding) -> None:
        fed = binding.take_fed()
        self.session.run_with_iobinding(binding.binding)
        fetched = {
            name: value_bytes(value)
            for name, value in binding.output_values().items()
            if value.device_name().lower() == "cpu"
        }
        self.runs.append(RunRecord(self.label, fed, fetched, binding))

    def end(self) -> list[RunProfile]:
        """Stop profiling and read the profile; one RunProfile per recorded run."""
        path = Path(self.session.end_profiling())
        try:
            profiles = read_profile(path)
        finally:
            path.unlink(missing_ok=True)
        if len(profiles) != len(self.runs):
            raise AssertionError(
                f"the profile has {len(profiles)} model_run events for {len(self.runs)} runs"
            )
        return profiles


def open_profiled(model_path: Path, prefix: Path, providers: Sequence[str]) -> ProfiledSession:
    """A ProfiledSession of `model_path` with tensord's session options and provider
    options (use_tf32 off, device 0) on `providers`, failing rather than falling back;
    its profile is written as `prefix`_<time>.json."""
    from tensord.backends.base import DeviceOptions
    from tensord.backends.onnxruntime import provider_options, session_options
    from tensord.backends.ort_session import StrictSession
    from tensord.modelconfig.model import ModelConfig

    config = ModelConfig()
    options = session_options(config)
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    requested = provider_options(providers, config, DeviceOptions())
    return ProfiledSession(
        StrictSession(str(model_path), sess_options=options, providers=requested)
    )


def open_runner(
    session: ProfiledSession, directory: Path, slots: int, length: int, device: str
) -> tuple[Any, Any]:
    """(a SlotRunner over `session`, its SlotStorage): `slots` slots of `length` positions
    of the builder folder `directory`, on `device` ("cpu" or "cuda"), as the loader makes
    them."""
    from tensord import dtypes
    from tensord.generate.model.model_dir import read_generator_spec
    from tensord.generate.model.slot_graph import slot_layout
    from tensord.generate.worker.kv_slots import SlotStorage
    from tensord.generate.worker.slot_runner import SlotRunner

    spec = read_generator_spec(directory)
    (logits,) = [o for o in session.session.get_outputs() if o.name == "logits"]
    logits_dtype = dtypes.from_ort_type(logits.type)
    assert logits_dtype is not None, logits.type
    storage = SlotStorage(slot_layout(spec, length), slots, device, 0)
    runner = SlotRunner(
        session,
        storage,
        logits_dtype=logits_dtype.numpy,
        vocab_size=spec.vocab_size,
        has_position_ids=spec.has_position_ids,
    )
    return runner, storage


# -- one decode pass, at a context and a batch -----------------------------------------


@dataclass(slots=True)
class StepTraffic:
    """One decode pass over `batch` slots that each hold `context` tokens before it."""

    context: int
    batch: int
    fed: dict[str, int]
    fetched: dict[str, int]
    memcpys: list[NodeEvent]
    attention_providers: set[str]
    binding: RecordingBinding | None = field(default=None, repr=False)
    """The pass's binding (rows 0..batch-1), holding its outputs after the run."""

    @property
    def mask_width(self) -> int:
        return self.context + 1

    def is_mask_copy(self, node: NodeEvent) -> bool:
        return node.output_shapes == (("int64", (self.batch, self.mask_width)),)

    @property
    def moved(self) -> int:
        """Every byte that crossed: fed, fetched and copied inside the run."""
        return sum(self.fed.values()) + sum(self.fetched.values()) + self._copied(True)

    @property
    def moved_without_mask(self) -> int:
        """What crossed besides the attention mask (its copies included)."""
        fed = sum(size for name, size in self.fed.items() if name != MASK)
        return fed + sum(self.fetched.values()) + self._copied(False)

    def _copied(self, with_mask: bool) -> int:
        return sum(n.output_bytes for n in self.memcpys if with_mask or not self.is_mask_copy(n))

    def describe(self) -> str:
        copies = ", ".join(f"{n.op} {n.output_bytes}" for n in self.memcpys) or "none"
        return (
            f"context {self.context:5d} batch {self.batch:2d}: {self.moved:7d} bytes "
            f"({self.moved_without_mask} without the mask); fed {self.fed}, fetched "
            f"{self.fetched}; Memcpy nodes: {copies}"
        )


def decode_prompt(context: int, row: int, vocab: int) -> list[int]:
    """A fixed prompt of `context` ordinary token ids for row `row`."""
    return [3 + (7 * i + 131 * row + 11) % (vocab - 3) for i in range(context)]


def measure_decode(
    session: ProfiledSession,
    runner: Any,
    vocab: int,
    contexts: Iterable[int],
    batches: Iterable[int],
    steps: int = 2,
) -> list[StepTraffic]:
    """For each context and batch: prefill slots 0..batch-1 with `context` tokens each,
    then `steps` decode passes over them through `runner` (a SlotRunner over `session`);
    the traffic of every decode pass. Ends the session's profiling."""
    from tensord.generate.core.scheduler_output import ScheduledRequest

    plan: list[tuple[int, int]] = []
    for context in contexts:
        for batch in batches:
            session.label = "prefill"
            tokens = []
            for row in range(batch):
                prompt = decode_prompt(context, row, vocab)
                logits = runner.execute([ScheduledRequest(f"r{row}", prompt, 0, [row])])
                tokens.append(int(np.argmax(logits.rows[0])))
            for step in range(steps):
                session.label = "decode"
                plan.append((context + step, batch))
                items = [
                    ScheduledRequest(f"r{row}", [tokens[row]], context + step, [row])
                    for row in range(batch)
                ]
                rows = runner.execute(items).rows
                tokens = [int(t) for t in np.argmax(rows, axis=-1)]
    profiles = session.end()
    decodes = [
        (record, profile)
        for record, profile in zip(session.runs, profiles, strict=True)
        if record.label == "decode"
    ]
    assert len(decodes) == len(plan), (len(decodes), len(plan))
    return [
        StepTraffic(
            context,
            batch,
            record.fed,
            record.fetched,
            profile.memcpys,
            profile.providers(ATTENTION_OP),
            record.binding,
        )
        for (context, batch), (record, profile) in zip(plan, decodes, strict=True)
    ]


def check_bound_in_place(binding: RecordingBinding, storage: Any, first: int, rows: int) -> None:
    """AssertionError unless every layer's past and present are bound, and come back after
    the run, as the slot buffers themselves: on the slots' device, at the address of slot
    `first`, `rows` slots long (ONNX Runtime read and wrote them in place)."""
    values = binding.output_values()
    layout = storage.layout
    for layer in range(layout.num_layers):
        size = rows * layout.layer_slab_bytes(layer)
        for kind, what in enumerate(("key", "value")):
            address = storage.address(layer, kind, first)
            want = Bound("", storage.device, address, size)
            for name, bound in (
                (
                    f"past_key_values.{layer}.{what}",
                    binding.inputs.get(f"past_key_values.{layer}.{what}"),
                ),
                (f"present.{layer}.{what}", binding.outputs.get(f"present.{layer}.{what}")),
            ):
                assert bound is not None, f"{name} is not bound"
                got = (bound.device, bound.ptr, bound.nbytes)
                assert got == (want.device, want.ptr, want.nbytes), (
                    f"{name} bound as {got}, not slot {first}'s buffer {want}"
                )
            value = values[f"present.{layer}.{what}"]
            got_value = (value.device_name().lower(), value.data_ptr(), value_bytes(value))
            assert got_value == (storage.device, address, size), (
                f"present.{layer}.{what} came back as {got_value} (device, address, bytes), "
                f"not slot {first}'s buffer {(storage.device, address, size)}"
            )


def check_traffic(steps: Sequence[StepTraffic], slab_bytes: int, provider: str) -> None:
    """AssertionError naming the step, unless: nothing of a KV slab's size (one slot's keys
    of one layer, `slab_bytes`) or named past/present crosses; GroupQueryAttention ran on
    `provider`; the bytes moved besides the mask are equal at every context of a batch and
    grow with the batch."""
    for step in steps:
        where = step.describe()
        for name, size in (*step.fed.items(), *step.fetched.items()):
            assert not name.startswith(_KV_PREFIXES), f"{name} crosses to or from the host: {where}"
            assert size < slab_bytes, f"{name} moves {size} bytes, a KV slab's size: {where}"
        for node in step.memcpys:
            assert node.output_bytes < slab_bytes, f"{node.name} copies a KV slab: {where}"
        assert step.attention_providers == {provider}, (
            f"{ATTENTION_OP} ran on {step.attention_providers}, not {provider}: {where}"
        )
    by_batch: dict[int, set[int]] = {}
    for step in steps:
        by_batch.setdefault(step.batch, set()).add(step.moved_without_mask)
    for batch, sizes in by_batch.items():
        assert len(sizes) == 1, (
            f"batch {batch}: the bytes moved besides the mask depend on the context "
            f"({sorted(sizes)}):\n" + "\n".join(s.describe() for s in steps)
        )
    ordered = sorted((batch, next(iter(sizes))) for batch, sizes in by_batch.items())
    for (small, fewer), (large, more) in itertools.pairwise(ordered):
        assert more > fewer, (
            f"batch {large} moves {more} bytes besides the mask, batch {small} {fewer}: not "
            "growing with the batch:\n" + "\n".join(s.describe() for s in steps)
        )
