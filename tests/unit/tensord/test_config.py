"""Configuration: defaults, file, TENSORD_* variables, flags, and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensord.config import TensordConfig, env_keys, load_config
from tensord.errors import ConfigError, ModelLoadError
from tensord.modelconfig.model import read_model_config


def test_defaults() -> None:
    config = load_config(None, env={})
    assert config.server.listen == "127.0.0.1:50051"
    assert config.server.max_receive_message_bytes == 64 * 1024 * 1024
    assert config.server.log_format == "auto"
    assert config.model_repository == Path.cwd() / "models"


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "tensord.toml"
    path.write_text(
        'model_repository = "repo"\n[server]\nlisten = "0.0.0.0:1"\nlog_level = "debug"\n'
    )
    config = load_config(path, env={})
    assert config.server.listen == "0.0.0.0:1"
    assert config.model_repository == tmp_path / "repo"  # relative to the file
    env = {"TENSORD_SERVER_LISTEN": "127.0.0.1:2", "TENSORD_SERVER_DRAIN_GRACE_SECONDS": "3.5"}
    config = load_config(path, env=env)
    assert (config.server.listen, config.server.drain_grace_seconds) == ("127.0.0.1:2", 3.5)
    config = load_config(
        path, env=env, overrides={"server.listen": "127.0.0.1:3", "server.log_level": None}
    )
    assert config.server.listen == "127.0.0.1:3"
    assert config.server.log_level == "debug"


def test_every_setting_has_an_env_variable() -> None:
    assert env_keys()["TENSORD_MODEL_REPOSITORY"] == "model_repository"
    assert (
        env_keys()["TENSORD_SERVER_MAX_RECEIVE_MESSAGE_BYTES"] == "server.max_receive_message_bytes"
    )
    assert {v for v in env_keys().values() if "." not in v} == {
        "model_repository",
        "cache_directory",
        "follow_model_symlinks",
    }
    tables = {"tls", "auth", "limits", "metrics", "tracing"}
    assert sorted(v for v in env_keys().values() if v.split(".")[0] in tables) == [
        "auth.burst",
        "auth.open_health",
        "auth.open_reflection",
        "auth.rate_per_second",
        "auth.token_file",
        "limits.max_generate_streams",
        "limits.max_prompt_tokens",
        "limits.max_request_bytes_in_flight",
        "limits.max_request_fields",
        "limits.max_tensors_per_request",
        "limits.max_typed_integers",
        "limits.receive_timeout_seconds",
        "metrics.listen",
        "tls.cert_file",
        "tls.client_ca_file",
        "tls.key_file",
        "tracing.enabled",
        "tracing.otlp_endpoint",
        "tracing.sample_ratio",
        "tracing.service_name",
    ]
    assert env_keys()["TENSORD_TLS_CLIENT_CA_FILE"] == "tls.client_ca_file"
    assert env_keys()["TENSORD_SERVER_MAX_CONNECTION_AGE_SECONDS"] == (
        "server.max_connection_age_seconds"
    )


def test_errors_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[server]\nlisten = "nowhere"\nmax_receive_message_bytes = 10\nlog_levle = "info"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert text.startswith(f"{path}: 3 invalid setting(s)")
    assert "server.listen: expected HOST:PORT such as 127.0.0.1:50051, got 'nowhere'" in text
    assert (
        "server.max_receive_message_bytes: expected a value greater than or equal to 1024 (got 10)"
        in text
    )
    assert "server.log_levle: unknown key" in text


def test_bad_env_value_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"TENSORD_SERVER_DRAIN_GRACE_SECONDS": "soon"})
    assert "server.drain_grace_seconds: expected a valid number" in str(info.value)


def test_unreadable_toml(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, env={})


def test_model_toml_validation(tmp_path: Path) -> None:
    (tmp_path / "model.toml").write_text(
        'preferred_provider = "cuda"\nproviders = ["cpu"]\nmax_batch_size = 8\n'
    )
    config = read_model_config(tmp_path)
    assert config.preferred_provider == "CUDAExecutionProvider"
    assert config.providers == ["CPUExecutionProvider"]
    (tmp_path / "model.toml").write_text(
        'preferred_provider = "tpu"\nmax_batch_size = -1\nbatch = 3\n'
    )
    with pytest.raises(ModelLoadError) as info:
        read_model_config(tmp_path)
    text = str(info.value)
    assert "preferred_provider: unknown execution provider 'tpu'; expected one of" in text
    assert "max_batch_size: expected a value greater than or equal to 0 (got -1)" in text
    assert "batch: unknown key" in text


def test_relative_repository_from_a_flag_is_from_the_working_directory(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "tensord.toml"
    path.parent.mkdir()
    path.write_text('model_repository = "models"\n')
    assert load_config(path, env={}).model_repository == tmp_path / "etc" / "models"
    flagged = load_config(path, env={}, overrides={"model_repository": "repo"})
    assert flagged.model_repository == Path.cwd() / "repo"


def test_dynamic_batching_settings(tmp_path: Path) -> None:
    (tmp_path / "model.toml").write_text(
        "max_batch_size = 16\n[dynamic_batching]\npreferred_batch_size = [8, 4, 8]\n"
        "max_queue_delay_microseconds = 500\nmax_queue_size = 100\n"
    )
    batching = read_model_config(tmp_path).dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_size == [4, 8]
    assert (batching.max_queue_delay_microseconds, batching.max_queue_size) == (500, 100)
    (tmp_path / "model.toml").write_text("[dynamic_batching]\n")
    with pytest.raises(ModelLoadError, match=r"\[dynamic_batching\] needs max_batch_size > 0"):
        read_model_config(tmp_path)
    (tmp_path / "model.toml").write_text(
        "max_batch_size = 4\n[dynamic_batching]\npreferred_batch_size = [8]\n"
    )
    with pytest.raises(
        ModelLoadError, match=r"preferred_batch_size \[8\] exceeds max_batch_size 4"
    ):
        read_model_config(tmp_path)


def test_security_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "tensord.toml"
    path.parent.mkdir()
    path.write_text(
        '[tls]\ncert_file = "tls/server.crt"\nkey_file = "/abs/server.key"\n'
        '[auth]\ntoken_file = "tokens.toml"\nrate_per_second = 2.5\n'
        '[metrics]\nlisten = "127.0.0.1:9464"\n'
    )
    config = load_config(path, env={"TENSORD_TLS_CLIENT_CA_FILE": "ca.crt"})
    assert config.tls.cert_file == tmp_path / "etc" / "tls" / "server.crt"
    assert config.tls.key_file == Path("/abs/server.key")
    assert config.tls.client_ca_file == Path.cwd() / "ca.crt"  # from a variable: the cwd
    assert config.auth.token_file == tmp_path / "etc" / "tokens.toml"
    assert (config.auth.rate_per_second, config.metrics.listen) == (2.5, "127.0.0.1:9464")
    assert not config.tracing.enabled and config.limits.max_generate_streams == 0
    unset = load_config(path, env={"TENSORD_AUTH_TOKEN_FILE": ""})
    assert unset.auth.token_file is None and not unset.auth.enabled


def test_security_settings_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[metrics]\nlisten = "9464"\n[auth]\nrate_per_second = -1\n[tracing]\nsample_ratio = 2\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    assert "metrics.listen: expected HOST:PORT such as 127.0.0.1:50051" in text
    assert "auth.rate_per_second: expected a value greater than or equal to 0 (got -1)" in text
    assert "tracing.sample_ratio: expected a value less than or equal to 1 (got 2)" in text


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("keepalive_time_seconds = inf", "server.keepalive_time_seconds: expected a finite"),
        ("keepalive_timeout_seconds = nan", "server.keepalive_timeout_seconds: expected a"),
        (
            "max_connection_age_seconds = 1e300",
            "server.max_connection_age_seconds: expected a value less than or equal to 604800",
        ),
        (
            "max_connection_age_grace_seconds = 604801",
            "server.max_connection_age_grace_seconds: expected a value less than or equal to",
        ),
        ("drain_grace_seconds = inf", "server.drain_grace_seconds: expected a finite"),
        (
            "drain_delay_seconds = 3601",
            "server.drain_delay_seconds: expected a value less than or equal to 3600",
        ),
    ],
)
def test_durations_are_finite_and_bounded(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"[server]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert message in str(info.value)
    path.write_text("[server]\nkeepalive_time_seconds = 604800\ndrain_grace_seconds = 3600\n")
    assert load_config(path, env={}).server.keepalive_time_seconds == 604800


def test_a_bad_value_names_the_variable_or_flag_it_came_from(tmp_path: Path) -> None:
    path = tmp_path / "base.toml"
    path.write_text('[server]\nlisten = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"TENSORD_SERVER_DRAIN_GRACE_SECONDS": "abc"})
    assert str(info.value) == (
        "TENSORD_SERVER_DRAIN_GRACE_SECONDS: 1 invalid setting(s)\n"
        "  server.drain_grace_seconds: expected a valid number, unable to parse string "
        "as a number (got 'abc')"
    )
    path.write_text('[server]\nlog_level = "loud"\n')
    with pytest.raises(ConfigError) as info:
        load_config(
            path,
            env={},
            overrides={"server.listen": "nowhere"},
            override_names={"server.listen": "--listen"},
        )
    assert str(info.value) == (
        f"--listen, {path}: 2 invalid setting(s)\n"
        "  server.listen (from --listen): expected HOST:PORT such as "
        "127.0.0.1:50051, got 'nowhere'\n"
        f"  server.log_level (from {path}): expected 'debug', 'info', 'warning' or "
        "'error' (got 'loud')"
    )


def test_an_empty_directory_setting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('model_repository = ""\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == (
        f"{path}: 1 invalid setting(s)\n  model_repository: expected a directory path, got ''"
    )
    with pytest.raises(ConfigError, match="TENSORD_MODEL_REPOSITORY: 1 invalid setting"):
        load_config(None, env={"TENSORD_MODEL_REPOSITORY": ""})
    with pytest.raises(ConfigError, match="cache_directory: expected a directory"):
        load_config(None, env={"TENSORD_CACHE_DIRECTORY": " "})


def test_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_bytes(b"\xff\xfe = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == (
        f"config {path}: not UTF-8 text (byte 0: invalid start byte); TOML files are UTF-8"
    )
    with pytest.raises(ConfigError, match="is a directory; expected a TOML file"):
        load_config(tmp_path, env={})


def test_ready_when_takes_one_of_three_policies() -> None:
    assert load_config(None, env={}).server.ready_when == "any_model"
    assert env_keys()["TENSORD_SERVER_READY_WHEN"] == "server.ready_when"
    config = load_config(None, env={"TENSORD_SERVER_READY_WHEN": "all_models"})
    assert config.server.ready_when == "all_models"
    with pytest.raises(ConfigError) as info:
        load_config(None, env={"TENSORD_SERVER_READY_WHEN": "some_models"})
    assert "server.ready_when: " in str(info.value)
    assert "'any_model', 'all_models' or 'always'" in str(info.value)


def test_only_the_listed_variables_count_spelled_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "TENSORD_SERVER_LISTEN": "127.0.0.1:7",
        "tensord_server_log_level": "debug",  # lower case: not a tensord variable
        "TENSORD_SERVER_LISTN": "x",  # misspelt: ignored, as any unknown variable
        "TENSORD_SERVER": '{"log_format": "json"}',  # a whole table: not a variable
        "TENSORD_SERVER_MAX_RECEIVE_MESSAGE_BYTES": "2048",
    }
    config = load_config(None, env=env)
    assert config.server.listen == "127.0.0.1:7"
    assert (config.server.log_level, config.server.log_format) == ("info", "auto")
    assert config.server.max_receive_message_bytes == 2048
    monkeypatch.setenv("TENSORD_SERVER_LISTEN", "127.0.0.1:8")
    assert load_config(None).server.listen == "127.0.0.1:8"  # the process's environment
    assert TensordConfig().server.listen == "127.0.0.1:50051"  # the defaults alone


def test_a_variable_under_a_key_that_is_not_a_table(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("server = 3\n")
    with pytest.raises(ConfigError, match=r"^server: expected a table, got 3$"):
        load_config(path, env={"TENSORD_SERVER_LISTEN": "127.0.0.1:1"})
