"""The files in systemd/: units verified by systemd-analyze, users and directories created by
systemd-sysusers and systemd-tmpfiles in a scratch root, the example config validated.

`systemd-analyze verify` resolves ExecStart: the units name /usr/local/bin/tensord, where
`pip install` puts it on a host. The tests verify copies whose ExecStart names the tensord
that this environment installed (everything else byte for byte the same), and check that
the shipped ExecStart is exactly the one replaced. No systemd needs to be running.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensord.config import load_config
from tests.tools import ROOT, systemd_tool

SYSTEMD = ROOT / "systemd"
UNITS = ("tensord.service", "tensord@.service")
INSTALLED = "/usr/local/bin/tensord"


def tensord_script() -> Path:
    script = Path(sys.executable).parent / "tensord"
    assert script.exists(), f"{script} is missing: run `make setup`"
    return script


def service_section(unit: str) -> dict[str, list[str]]:
    """Every key of [Service] with all its values (systemd keys may repeat)."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in (SYSTEMD / unit).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def verify(directory: Path, *names: str) -> subprocess.CompletedProcess[str]:
    analyze = systemd_tool("systemd-analyze")
    return subprocess.run(
        [str(analyze), "verify", "--man=no", *(str(directory / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def unit_copies(tmp_path: Path) -> Path:
    for unit in UNITS:
        text = (SYSTEMD / unit).read_text()
        assert text.count(f"ExecStart={INSTALLED} ") == 1
        (tmp_path / unit).write_text(text.replace(INSTALLED, str(tensord_script())))
    return tmp_path


def test_units_verify_clean(unit_copies: Path) -> None:
    # The template is verified as an instance (tensord@0) and as itself.
    result = verify(unit_copies, "tensord.service", "tensord@0.service", "tensord@.service")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_verify_catches_a_broken_unit(unit_copies: Path) -> None:
    """The check above can fail: a missing binary and an unknown key are reported."""
    unit = unit_copies / "tensord.service"
    unit.write_text(
        unit.read_text().replace(str(tensord_script()), "/nonexistent/tensord")
        + "\n[Service]\nWatchdogSecs=5\n"
    )
    result = verify(unit_copies, "tensord.service")
    assert result.returncode != 0
    assert "/nonexistent/tensord" in result.stderr
    assert "Unknown key 'WatchdogSecs'" in result.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_unit_settings(unit: str) -> None:
    s = service_section(unit)
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["Restart"] == ["on-failure"]
    assert s["WatchdogSec"] == ["30s"]
    assert s["User"] == ["tensord"] and s["ProtectSystem"] == ["strict"]
    assert s["StateDirectory"] == ["tensord"] and s["CacheDirectory"] == ["tensord"]
    assert s["LimitMEMLOCK"] == ["infinity"]
    assert s["DevicePolicy"] == ["closed"] and s["PrivateDevices"] == ["no"]
    assert s["DeviceAllow"] == [
        "char-nvidia-frontend rw",
        "char-nvidia-uvm rw",
        "char-nvidia-caps r",
    ]
    assert not any("*" in rule for rule in s["DeviceAllow"])
    # The stop timeout covers the default drain grace.
    grace = load_config(None, env={}).server.drain_grace_seconds
    stop = s["TimeoutStopSec"][0]
    assert stop.endswith("s") and float(stop[:-1]) > grace


def test_instances_get_one_gpu_and_their_own_port() -> None:
    s = service_section("tensord@.service")
    assert "CUDA_VISIBLE_DEVICES=%i" in s["Environment"]
    assert "TENSORD_SERVER_CUDA_DEVICE=0" in s["Environment"]
    assert s["EnvironmentFile"] == ["/etc/tensord/instance-%i.env"]
    assert s["RuntimeDirectory"] == ["tensord-%i"]
    # The example instance file sets a valid listen address through the variable.
    env = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "instance-0.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert load_config(None, env=env).server.listen == "127.0.0.1:50051"


def test_sysusers_and_tmpfiles_in_a_scratch_root(tmp_path: Path) -> None:
    sysusers = systemd_tool("systemd-sysusers")
    tmpfiles = systemd_tool("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / name).touch()
    run = [str(sysusers), f"--root={root}", str(SYSTEMD / "tensord.sysusers")]
    created = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    passwd = (root / "etc" / "passwd").read_text()
    match = re.search(r"^tensord:x:(\d+):(\d+):[^:]*:/var/lib/tensord:", passwd, re.M)
    assert match, passwd
    uid = int(match.group(1))
    assert re.search(r"^video:x:\d+:tensord$", (root / "etc" / "group").read_text(), re.M)

    run = [str(tmpfiles), f"--root={root}", "--create", str(SYSTEMD / "tensord.tmpfiles")]
    made = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    for sub in ("var/lib/tensord/models", "var/cache/tensord/tensorrt", "var/cache/tensord/cuda"):
        st = (root / sub).stat()
        assert st.st_uid == uid and oct(st.st_mode & 0o777) == "0o750", sub
    assert (root / "etc" / "tensord").is_dir()


def test_example_config_is_valid_and_matches_the_units() -> None:
    config = load_config(SYSTEMD / "tensord.toml", env={})
    assert config.model_repository == Path("/var/lib/tensord/models")
    assert config.cache_directory == Path("/var/cache/tensord")
    s = service_section("tensord.service")
    assert float(s["TimeoutStopSec"][0][:-1]) > config.server.drain_grace_seconds
    assert "/etc/tensord/tensord.toml" in s["ExecStart"][0]


def test_tmpfiles_and_units_agree_on_directories() -> None:
    """The example config's directories are the unit's StateDirectory/CacheDirectory, which
    the tmpfiles file also creates."""
    config = load_config(SYSTEMD / "tensord.toml", env={})
    tmpfiles = (SYSTEMD / "tensord.tmpfiles").read_text().split()
    for unit in UNITS:
        s = service_section(unit)
        assert Path("/var/lib") / s["StateDirectory"][0] == config.model_repository.parent
        assert Path("/var/cache") / s["CacheDirectory"][0] == config.cache_directory
    assert str(config.model_repository) in tmpfiles
    assert str(config.cache_directory) in tmpfiles
