"""Pure reload logic: file fingerprints, the reload plan, restart-only settings."""

from __future__ import annotations

import os
from pathlib import Path

from tensord.config import load_config
from tensord.modelconfig.model import ModelConfig
from tensord.registry.changes import plan_reload
from tensord.registry.repository import fingerprint, scan_repository
from tensord.registry.version import ModelState, ModelVersion, PredictVersion, from_source
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
        entry = from_source(src)
        entry.state = ModelState.READY
        served.setdefault(src.name, {})[1] = entry
    served["b"][1].state = ModelState.FAILED  # failed before: tried again
    (root / "c" / "model.toml").write_text("max_batch_size = 4\n")  # settings changed
    (root / "a" / "2").mkdir()
    (root / "a" / "2" / "model.onnx").write_bytes(b"a2")
    gone = PredictVersion("old", 3, root / "old", ModelConfig())
    served["old"] = {3: gone}

    plan = plan_reload(served, scan_repository(root))
    assert [(s.name, s.version) for s in plan.added] == [("a", 2)]
    assert sorted(old.name for _, old in plan.changed) == ["b", "c"]
    assert plan.removed == [gone]
    assert plan.unchanged == 1

    # Nothing on disk differs from what is served: nothing to do.
    current: dict[str, dict[int, ModelVersion]] = {}
    for src in scan_repository(root):
        entry = from_source(src)
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


def _serve(sources, state: ModelState = ModelState.READY):  # type: ignore[no-untyped-def]
    served: dict[str, dict[int, ModelVersion]] = {}
    for src in sources:
        entry = from_source(src)
        entry.state = state
        served.setdefault(src.name, {})[src.version] = entry
    return served


def test_a_broken_model_toml_keeps_every_served_version(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "a" / "2").mkdir()
    (root / "a" / "2" / "model.onnx").write_bytes(b"a2")
    (root / "b" / "model.toml").write_text('name = "renamed"\n')
    served = _serve(scan_repository(root))
    assert sorted((n, sorted(v)) for n, v in served.items()) == [
        ("a", [1, 2]),
        ("c", [1]),
        ("renamed", [1]),
    ]
    (root / "a" / "model.toml").write_text("max_batch_size = [\n")
    (root / "b" / "model.toml").write_bytes(b'name = "renamed\xff"\n')

    plan = plan_reload(served, scan_repository(root))
    assert (plan.added, plan.changed, plan.removed, plan.unchanged) == ([], [], [], 1)
    kept = [(mv.name, mv.version, reason.split(":")[0]) for mv, reason in plan.kept]
    assert sorted(kept) == [
        ("a", 1, f"{root}/a/model.toml"),
        ("a", 2, f"{root}/a/model.toml"),
        ("renamed", 1, f"{root}/b/model.toml"),
    ]
    assert "not valid TOML" in plan.kept[0][1]

    # Another directory claiming a kept name does not take it over.
    (root / "d" / "1").mkdir(parents=True)
    (root / "d" / "1" / "model.onnx").write_bytes(b"d")
    (root / "d" / "model.toml").write_text('name = "renamed"\n')
    plan = plan_reload(served, scan_repository(root))
    assert len(plan.kept) == 3 and plan.removed == [] and plan.added == []
    ((src, old),) = plan.changed
    assert (src.name, src.model_dir, old.model_dir) == ("renamed", root / "d", root / "b")
    assert src.error.startswith(f"model name 'renamed' is also served from {root}/b, kept")


def test_a_broken_model_toml_replaces_versions_that_serve_nothing(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    served = _serve(scan_repository(root), ModelState.FAILED)
    (root / "a" / "model.toml").write_text("max_batch_size = [\n")
    plan = plan_reload(served, scan_repository(root))
    assert plan.kept == []
    # Failed entries are tried again; the one of "a" is replaced with the new reason.
    assert sorted(old.name for _, old in plan.changed) == ["a", "b", "c"]
    src = next(src for src, old in plan.changed if old.name == "a")
    assert src.whole_model and "not valid TOML" in src.error


def test_switching_tls_or_auth_on_needs_a_restart(tmp_path: Path) -> None:
    running = load_config(None, env={})
    fresh = load_config(
        None,
        env={},
        overrides={
            "tls.cert_file": str(tmp_path / "c.pem"),
            "tls.key_file": str(tmp_path / "k.pem"),
            "auth.token_file": str(tmp_path / "tokens.toml"),
            "auth.burst": 5,
            "server.keepalive_time_seconds": 5.0,
            "limits.max_generate_streams": 4,
            "limits.max_prompt_tokens": 100,
            "tracing.sample_ratio": 0.5,
        },
    )
    merged, ignored = keep_restart_only(running, fresh, RESTART_ONLY_KEYS)
    assert ignored == {
        "tls": ("plaintext", "tls"),
        "auth": ("off", "tokens"),
        "server.keepalive_time_seconds": (60.0, 5.0),
        "limits.max_generate_streams": (0, 4),
        "tracing.sample_ratio": (1.0, 0.5),
    }
    assert merged.tls == running.tls and merged.auth == running.auth
    assert merged.limits.max_prompt_tokens == 100  # live


def test_a_change_to_required_alone_loads_nothing_again(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    served = _serve(scan_repository(root))
    (root / "a" / "model.toml").write_text("required = true\n")
    (root / "b" / "model.toml").write_text("required = true\nmax_batch_size = 4\n")
    plan = plan_reload(served, scan_repository(root))
    assert [old.name for _, old in plan.changed] == ["b"]  # its other settings changed
    assert [(src.name, src.config.required) for src, _ in plan.retagged] == [("a", True)]
    assert plan.retagged[0][1] is served["a"][1] and plan.unchanged == 2
