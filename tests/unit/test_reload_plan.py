"""Pure reload logic: file fingerprints, the reload plan, restart-only settings."""

from __future__ import annotations

import os
from pathlib import Path

from tensord.config import load_config
from tensord.registry.changes import plan_reload
from tensord.registry.model_config import ModelConfig
from tensord.registry.registry import ModelState, ModelVersion
from tensord.registry.repository import fingerprint, scan_repository
from tensord.server.reload import RESTART_ONLY_KEYS, keep_restart_only


def _repo(root: Path) -> Path:
    for name in ("a", "b", "c"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(name.encode())
    return root


def test_fingerprint_sees_edits_copies_and_renames(tmp_path: Path) -> None:
    d = tmp_path / "1"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"12345")
    (d / "weights.bin").write_bytes(b"w")
    (d / "model.toml").write_text("max_batch_size = 1\n")  # compared as settings instead
    first = fingerprint(d)
    assert [entry[:2] for entry in first] == [("model.onnx", 5), ("weights.bin", 1)]
    assert fingerprint(d) == first
    st = (d / "model.onnx").stat()
    # Same size, same mtime, new inode: a file renamed over the old one.
    (d / "staging").write_bytes(b"54321")
    os.utime(d / "staging", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(d / "staging", d / "model.onnx")
    assert fingerprint(d) != first
    second = fingerprint(d)
    os.utime(d / "weights.bin", ns=(1, 1))
    assert fingerprint(d) != second


def test_plan_sorts_versions(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    served: dict[str, dict[int, ModelVersion]] = {}
    for src in scan_repository(root):
        entry = ModelVersion.from_source(src)
        entry.state = ModelState.READY
        served.setdefault(src.name, {})[1] = entry
    served["b"][1].state = ModelState.FAILED  # failed before: tried again
    (root / "c" / "model.toml").write_text("max_batch_size = 4\n")  # settings changed
    (root / "a" / "2").mkdir()
    (root / "a" / "2" / "model.onnx").write_bytes(b"a2")
    gone = ModelVersion("old", 3, root / "old", ModelConfig())
    served["old"] = {3: gone}

    plan = plan_reload(served, scan_repository(root))
    assert [(s.name, s.version) for s in plan.added] == [("a", 2)]
    assert sorted(old.name for _, old in plan.changed) == ["b", "c"]
    assert plan.removed == [gone]
    assert plan.unchanged == 1

    # Nothing on disk differs from what is served: nothing to do.
    current: dict[str, dict[int, ModelVersion]] = {}
    for src in scan_repository(root):
        entry = ModelVersion.from_source(src)
        entry.state = ModelState.READY
        current.setdefault(src.name, {})[src.version] = entry
    quiet = plan_reload(current, scan_repository(root))
    assert (quiet.added, quiet.changed, quiet.removed, quiet.unchanged) == ([], [], [], 4)


def test_restart_only_keys_keep_their_running_value() -> None:
    running = load_config(None, env={})
    fresh = load_config(
        None,
        env={},
        overrides={
            "server.listen": "0.0.0.0:7000",
            "server.drain_grace_seconds": 3.0,
            "cache_directory": "/var/cache/other",
        },
    )
    merged, ignored = keep_restart_only(running, fresh, RESTART_ONLY_KEYS)
    assert set(ignored) == {"server.listen", "cache_directory"}
    assert ignored["server.listen"] == ("127.0.0.1:50051", "0.0.0.0:7000")
    assert merged.server.listen == "127.0.0.1:50051"
    assert merged.cache_directory == running.cache_directory
    assert merged.server.drain_grace_seconds == 3.0
    assert fresh.server.listen == "0.0.0.0:7000"  # the input is not modified
