"""Token file, bearer tokens, permissions and rate limits, without a server."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tensord.access import Principal, check_model, current_principal
from tensord.config_tables import AuthSettings
from tensord.errors import (
    ConfigError,
    PermissionDeniedError,
    RateLimitedError,
    UnauthenticatedError,
)
from tensord.server.auth import Authenticator, bearer_token, hash_token, token_entry
from tensord.server.ratelimit import Rate, TokenBucket

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"


def write_tokens(path: Path, *entries: str) -> Path:
    path.write_text("\n".join(entries))
    return path


def bearer(token: str) -> list[tuple[str, str]]:
    return [("x-request-id", "r1"), ("authorization", f"Bearer {token}")]


def test_hash_is_sha256_hex() -> None:
    # The FIPS 180-2 test vector for "abc".
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_entry_round_trips_through_the_file(tmp_path: Path) -> None:
    path = write_tokens(
        tmp_path / "tokens.toml",
        token_entry('ci "nightly"', hash_token(ALICE), ["mlp", "cnn"], 2.5, 4),
        token_entry("admin", hash_token(BOB), ["*"]),
    )
    parsed = tomllib.loads(path.read_text())["token"]
    assert parsed[0] == {
        "name": 'ci "nightly"',
        "sha256": hash_token(ALICE),
        "models": ["mlp", "cnn"],
        "rate_per_second": 2.5,
        "burst": 4,
    }
    auth = Authenticator(AuthSettings(token_file=path))
    assert auth.admit(bearer(ALICE)) == Principal('ci "nightly"', frozenset({"mlp", "cnn"}))
    assert auth.admit(bearer(BOB)).models == frozenset({"*"})


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "missing credentials: send the metadata 'authorization: Bearer <token>'"),
        ([("authorization", f"Basic {ALICE}")], "must be 'Bearer <token>'"),
        ([("authorization", "Bearer ")], "must be 'Bearer <token>'"),
        (bearer("not-a-known-token-at-all"), "invalid bearer token"),
    ],
)
def test_bad_credentials_are_unauthenticated(
    tmp_path: Path, metadata: list[tuple[str, str]], message: str
) -> None:
    path = write_tokens(tmp_path / "t.toml", token_entry("a", hash_token(ALICE), ["*"]))
    auth = Authenticator(AuthSettings(token_file=path))
    with pytest.raises(UnauthenticatedError, match=message.replace("(", r"\(")):
        auth.admit(metadata)


def test_scheme_is_case_insensitive() -> None:
    assert bearer_token([("authorization", f"bearer {ALICE}")]) == ALICE
    assert bearer_token([("authorization", f"BEARER  {ALICE} ".encode())]) == ALICE


def test_bad_token_files_name_the_problem(tmp_path: Path) -> None:
    cases = {
        "missing.toml": None,
        "syntax.toml": "[[token]\n",
        "digest.toml": '[[token]]\nname = "a"\nsha256 = "abc"\nmodels = ["*"]\n',
        "models.toml": f'[[token]]\nname = "a"\nsha256 = "{hash_token(ALICE)}"\nmodels = []\n',
        "dupe.toml": token_entry("a", hash_token(ALICE), ["*"])
        + token_entry("a", hash_token(BOB), ["*"]),
        "same.toml": token_entry("a", hash_token(ALICE), ["*"])
        + token_entry("b", hash_token(ALICE), ["*"]),
        "extra.toml": token_entry("a", hash_token(ALICE), ["*"]) + "role = 'admin'\n",
    }
    expected = {
        "missing.toml": "cannot read: No such file or directory",
        "syntax.toml": "not valid TOML",
        "digest.toml": "token.0.sha256: expected 64 hex digits",
        "models.toml": "token.0.models: List should have at least 1 item",
        "dupe.toml": "two tokens are named 'a'",
        "same.toml": "token 'b' repeats another's sha256",
        "extra.toml": "token.0.role: unknown key",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError) as info:
            Authenticator(AuthSettings(token_file=path))
        assert f"token file {path}" in str(info.value)
        assert expected[name] in str(info.value), name


def test_reload_swaps_tokens_and_keeps_them_when_the_file_is_bad(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.toml", token_entry("alice", hash_token(ALICE), ["mlp"]))
    auth = Authenticator(AuthSettings(token_file=path))
    assert auth.admit(bearer(ALICE)).name == "alice"
    write_tokens(path, token_entry("bob", hash_token(BOB), ["cnn"]))
    assert auth.reload() == 1
    assert auth.admit(bearer(BOB)).name == "bob"
    with pytest.raises(UnauthenticatedError):
        auth.admit(bearer(ALICE))
    path.write_text("not toml [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        auth.reload()
    assert auth.admit(bearer(BOB)).name == "bob"  # still in force


def test_token_bucket_exact() -> None:
    bucket = TokenBucket(Rate.of(2.0, 3), now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)  # one permit every 0.5 s
    assert bucket.take(100.25) == pytest.approx(0.25)
    assert bucket.take(100.5) == 0.0
    assert bucket.take(110.0) == 0.0  # refilled, capped at the burst
    assert bucket.take(110.0) == 0.0
    assert bucket.take(110.0) == 0.0
    assert bucket.take(110.0) == pytest.approx(0.5)
    assert Rate.of(0.5) == Rate(0.5, 1) and Rate.of(7.2) == Rate(7.2, 8)
    assert not Rate.of(0).limited


def test_rate_limit_per_token_with_defaults_and_overrides(tmp_path: Path) -> None:
    path = write_tokens(
        tmp_path / "t.toml",
        token_entry("alice", hash_token(ALICE), ["*"]),  # the [auth] default: 1/s, burst 2
        token_entry("bob", hash_token(BOB), ["*"], rate=0.0) + "rate_per_second = 0\n",
    )
    auth = Authenticator(AuthSettings(token_file=path, rate_per_second=1.0, burst=2))
    start = time.monotonic()
    auth.admit(bearer(ALICE))
    auth.admit(bearer(ALICE))
    with pytest.raises(RateLimitedError) as info:
        auth.admit(bearer(ALICE))
    took = time.monotonic() - start
    # A whole second for the next permit, less what refilled since the first call.
    wait = info.value.retry_after_s
    assert 1.0 - took <= wait <= 1.0, (wait, took)
    assert info.value.message == (
        f"token 'alice' is over its rate limit of 1 requests/s (burst 2); retry in {wait:.3f} s"
    )
    for _ in range(50):  # bob's entry turns the limit off
        auth.admit(bearer(BOB))


def test_permission_follows_the_principal_in_context() -> None:
    check_model("anything")  # no principal: authentication is off
    token = current_principal.set(Principal("ci", frozenset({"mlp"})))
    try:
        check_model("mlp")
        with pytest.raises(PermissionDeniedError) as info:
            check_model("cnn")
        assert info.value.message == (
            "token 'ci' may not use model 'cnn' (it may use: mlp); add the model to the "
            "token's models in the token file"
        )
        current_principal.set(Principal("admin", frozenset({"*"})))
        check_model("cnn")
    finally:
        current_principal.reset(token)


def test_hash_token_command(tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "hash-token", "--name", "ci", "--model", "mlp"],
        capture_output=True,
        text=True,
        check=True,
    )
    token = made.stderr.strip().rsplit(" ", 1)[-1]
    assert len(token) == 43
    entry = tomllib.loads(made.stdout)["token"][0]
    assert entry == {"name": "ci", "sha256": hash_token(token), "models": ["mlp"]}
    given = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "hash-token", "--name", "x", "--stdin"],
        input=f"{ALICE}\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert tomllib.loads(given.stdout)["token"][0]["sha256"] == hash_token(ALICE)
    assert given.stderr == ""
    short = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "hash-token", "--name", "x", "--stdin"],
        input="short\n",
        capture_output=True,
        text=True,
    )
    assert short.returncode == 2
    assert "at least 16 characters" in short.stderr


def test_check_config_reads_the_token_file_and_certificates(tmp_path: Path) -> None:
    config = tmp_path / "tensord.toml"
    config.write_text(
        f'model_repository = "{tmp_path}"\n[auth]\ntoken_file = "tokens.toml"\n'
        '[tls]\ncert_file = "server.crt"\nkey_file = "server.key"\n'
    )
    (tmp_path / "tokens.toml").write_text("[[token]]\nname = 'x'\n")
    done = subprocess.run(
        [sys.executable, "-m", "tensord.cli", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    problems = [line for line in done.stderr.splitlines() if line.startswith("security")]
    assert problems == [
        f"security problem: tls: cert_file {tmp_path}/server.crt: cannot read: "
        "No such file or directory",
        f"security problem: token file {tmp_path}/tokens.toml: 2 invalid setting(s)",
    ]


def test_token_entries_are_toml_for_any_name() -> None:
    import tomllib

    name = 'bot\U0001f916 "q" \\ tab\tend'  # beyond U+FFFF, quotes, backslash, control
    entry = token_entry(name, hash_token(ALICE), ["m\u00e9", "*"])
    (parsed,) = tomllib.loads(entry)["token"]
    assert parsed["name"] == name and parsed["models"] == ["m\u00e9", "*"]


def test_a_reload_keeps_each_tokens_bucket_and_retunes_it(tmp_path: Path) -> None:
    path = write_tokens(
        tmp_path / "t.toml", token_entry("a", hash_token(ALICE), ["*"], rate=0.001, burst=2)
    )
    auth = Authenticator(AuthSettings(token_file=path))
    auth.admit(bearer(ALICE))
    auth.admit(bearer(ALICE))
    auth.reload()  # the same file: the bucket, emptied by two calls, stays empty
    with pytest.raises(RateLimitedError, match=r"0\.001 requests/s"):
        auth.admit(bearer(ALICE))
    write_tokens(path, token_entry("a", hash_token(ALICE), ["*"], rate=0.002, burst=2))
    auth.reload()
    with pytest.raises(RateLimitedError, match=r"0\.002 requests/s"):
        auth.admit(bearer(ALICE))
