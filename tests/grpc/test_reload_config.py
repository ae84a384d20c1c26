"""Reload re-reads the config file: a bad file keeps the running config (and the models are
still rescanned), restart-only keys are ignored with a log line, live keys apply, and reload
hooks run with the new config."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensord.config import TensordConfig, load_config
from tensord.dataplane import LocalEngine
from tensord.server.notify import SystemdNotifier
from tests.conftest import ServerThread
from tests.notify_socket import NotifyListener


@pytest.fixture
def config_file(demo_repo: Path, tmp_path: Path) -> Path:
    shutil.copytree(demo_repo / "mlp", tmp_path / "models" / "mlp")
    path = tmp_path / "tensord.toml"
    path.write_text(
        'model_repository = "models"\n[server]\nlisten = "127.0.0.1:0"\ndrain_grace_seconds = 5.0\n'
    )
    return path


@pytest.fixture
def server(config_file: Path) -> Iterator[ServerThread]:
    def loader() -> TensordConfig:
        return load_config(config_file, env={})

    srv = ServerThread(loader(), config_loader=loader).start()
    yield srv
    srv.stop()


def test_bad_config_keeps_the_running_one(server: ServerThread, config_file: Path) -> None:
    """...and takes nothing else down: a model added in the same reload is served."""
    assert server.server is not None
    running = server.server.config
    config_file.write_text('model_repository = "models"\n[server]\nlisten = "nowhere"\n')
    shutil.copytree(config_file.parent / "models" / "mlp", config_file.parent / "models" / "mlp2")
    result = server.call(server.server.reload())
    assert not result.ok and result.models is not None and result.models.added == ["mlp2 v1"]
    assert result.config_error.startswith(f"{config_file}: 1 invalid setting(s)")
    assert "server.listen" in result.config_error
    assert server.server.config is running
    config_file.write_text("this is [not toml")
    result = server.call(server.server.reload())
    assert "not valid TOML" in result.config_error
    assert server.server.config is running
    assert server.server.registry.names() == ["mlp", "mlp2"]
    nested = "a = " + "[" * 3000 + "]" * 3000 + "\n"
    config_file.write_text(nested)
    result = server.call(server.server.reload())
    assert result.config_error.startswith(
        f"config {config_file}: line 1: nested too deeply (at most 64 levels;"
    )


def test_restart_only_keys_are_ignored_and_live_keys_apply(
    server: ServerThread, config_file: Path
) -> None:
    assert server.server is not None
    config_file.write_text(
        'model_repository = "models"\n'
        '[server]\nlisten = "127.0.0.1:9"\ndrain_grace_seconds = 12.5\n'
        "max_receive_message_bytes = 2048\nswitch_interval_us = 300\n"
    )
    result = server.call(server.server.reload())
    assert result.ok
    assert result.ignored == {
        "server.listen": ("127.0.0.1:0", "127.0.0.1:9"),
        "server.max_receive_message_bytes": (64 * 1024 * 1024, 2048),
    }
    config = server.server.config
    assert config.server.listen == "127.0.0.1:0"
    assert config.server.max_receive_message_bytes == 64 * 1024 * 1024
    assert config.server.drain_grace_seconds == 12.5
    assert config.server.switch_interval_us == 300


def test_hooks_run_with_the_new_config_and_a_failing_one_stops_nothing(
    server: ServerThread, config_file: Path, tmp_path: Path
) -> None:
    assert server.server is not None
    seen: list[tuple[str, float]] = []

    def certificates(config: TensordConfig) -> None:
        seen.append(("sync", config.server.drain_grace_seconds))

    async def tokens(config: TensordConfig) -> None:
        seen.append(("async", config.server.drain_grace_seconds))

    def broken(config: TensordConfig) -> None:
        raise ValueError("token file /etc/tensord/tokens: line 3 is not NAME:HASH")

    server.server.add_reload_hook(certificates)
    server.server.add_reload_hook(broken)
    server.server.add_reload_hook(tokens)
    # The model repository moves too: a reload serves from the new one.
    shutil.copytree(tmp_path / "models", tmp_path / "models2")
    shutil.rmtree(tmp_path / "models2" / "mlp")
    shutil.copytree(tmp_path / "models" / "mlp", tmp_path / "models2" / "mlp2")
    config_file.write_text(
        'model_repository = "models2"\n[server]\nlisten = "127.0.0.1:0"\n'
        "drain_grace_seconds = 7.0\n"
    )
    result = server.call(server.server.reload())
    assert seen == [("sync", 7.0), ("async", 7.0)]
    assert len(result.hook_errors) == 1 and not result.ok
    assert "line 3 is not NAME:HASH" in result.hook_errors[0]
    assert result.models is not None
    assert result.models.added == ["mlp2 v1"] and result.models.removed == ["mlp v1"]
    assert server.server.config.model_repository == tmp_path / "models2"


def test_every_setting_a_reload_cannot_apply_is_reported(
    server: ServerThread, config_file: Path
) -> None:
    assert server.server is not None
    config_file.write_text(
        'model_repository = "models"\n'
        '[server]\nlisten = "127.0.0.1:0"\ndrain_grace_seconds = 5.0\n'
        "keepalive_time_seconds = 30\nmax_concurrent_streams = 8\n"
        '[metrics]\nlisten = "127.0.0.1:0"\n[tracing]\nenabled = true\n'
        "[limits]\nmax_generate_streams = 3\nmax_prompt_tokens = 50\n"
        '[auth]\ntoken_file = "tokens.toml"\n'
    )
    result = server.call(server.server.reload())
    assert result.ok, result
    assert result.ignored == {
        "auth": ("off", "tokens"),
        "server.keepalive_time_seconds": (60.0, 30.0),
        "server.max_concurrent_streams": (0, 8),
        "metrics.listen": ("", "127.0.0.1:0"),
        "tracing.enabled": (False, True),
        "limits.max_generate_streams": (0, 3),
    }
    config = server.server.config
    assert config.auth.token_file is None and not config.tracing.enabled
    assert config.limits.max_prompt_tokens == 50  # applied
    engine = server.server.engine
    assert isinstance(engine, LocalEngine) and engine.max_prompt_tokens == 50


def test_a_reload_always_finishes_its_notification(config_file: Path, tmp_path: Path) -> None:
    listener = NotifyListener()
    calls: list[int] = []

    def loader() -> TensordConfig:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the disk went away")
        return load_config(config_file, env={})

    srv = ServerThread(loader(), config_loader=loader)
    srv.start()
    try:
        assert srv.server is not None
        srv.server.notifier = SystemdNotifier({"NOTIFY_SOCKET": listener.address})
        # An unexpected error from the config loader: the running config stays.
        first = srv.call(srv.server.reload())
        assert first.config_error == "RuntimeError('the disk went away')"
        # A model.toml that is a directory, and a config file that is not UTF-8.
        shutil.copytree(tmp_path / "models" / "mlp", tmp_path / "models" / "other")
        (tmp_path / "models" / "other" / "model.toml").unlink()
        (tmp_path / "models" / "other" / "model.toml").mkdir()
        second = srv.call(srv.server.reload())
        assert second.models is not None and second.models.failed == ["other v1"]
        assert "model.toml: is a directory" in srv.server.registry.get_versions("other")[0].reason
        config_file.write_bytes(b'model_repository = "caf\xe9"\n')
        third = srv.call(srv.server.reload())
        assert "not UTF-8 text" in third.config_error
        got = [listener.receive(5) for _ in range(6)]
    finally:
        srv.stop()
        listener.close()
    assert [m is not None and ("RELOADING" in m, m.get("READY")) for m in got] == [
        (True, None),
        (False, "1"),
    ] * 3
    assert all(m is not None and "last reload had errors" in m["STATUS"] for m in got[1::2])
