"""The OpenAI-compatible HTTP API over a real server: the official `openai` client and curl,
tokens equal to tensor.v1 Generate's, the chat template as transformers renders it, errors
in OpenAI's shape, bearer tokens, and a disconnect that frees the sequence's KV blocks."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensord.server.auth import hash_token, token_entry
from tensord_client import Client
from tests.conftest import ServerThread, serve, wait_generator_idle
from tests.models import SMALL_GENERATOR_TOML

openai = pytest.importorskip("openai")

MODEL = "tinylm"
PLAIN = "tinylm_plain"
JINJA = "tinylm_jinja"
ADMIN = "admin-token-aaaaaaaaaaaaaaaaaaaa"
PLAIN_ONLY = "plain-only-token-bbbbbbbbbbbbbbbb"
LIMITED = "limited-token-cccccccccccccccccc"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\n"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
JINJA_TEMPLATE = (
    "{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the quick brown fox."},
]


@pytest.fixture(scope="module")
def repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openai-repo")
    for name in (MODEL, PLAIN):
        shutil.copytree(demo_repo / MODEL, root / name)
        (root / name / "model.toml").write_text(SMALL_GENERATOR_TOML)
    config_path = root / MODEL / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    # A newer export: the template in chat_template.jinja, which wins over the config's.
    shutil.copytree(root / MODEL, root / JINJA)
    (root / JINJA / "chat_template.jinja").write_text(JINJA_TEMPLATE)
    return root


@pytest.fixture(scope="module")
def srv(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tokens = tmp_path_factory.mktemp("openai-auth") / "tokens.toml"
    tokens.write_text(
        token_entry("admin", hash_token(ADMIN), ["*"])
        + token_entry("plain-only", hash_token(PLAIN_ONLY), [PLAIN])
        + token_entry("limited", hash_token(LIMITED), ["*"], rate=0.01, burst=1)
    )
    server = serve(repo, auth__token_file=tokens, openai__listen="127.0.0.1:0")
    yield server
    server.stop()


def base_url(srv: ServerThread) -> str:
    assert srv.server is not None and srv.server.openai is not None
    return f"http://127.0.0.1:{srv.server.openai.port}/v1"


@pytest.fixture(scope="module")
def api(srv: ServerThread) -> Any:
    return openai.OpenAI(base_url=base_url(srv), api_key=ADMIN, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def grpc_client(srv: ServerThread) -> Iterator[Client]:
    with Client(srv.target, timeout=30, retries=0, token=ADMIN) as client:
        yield client


def generate(client: Client, **request: Any) -> tuple[list[int], str, Any]:
    """tensord.v1 Generate's token ids, text and last chunk."""
    chunks = list(client.generate(MODEL, temperature=0, **request))
    return [t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks), chunks[-1]


def test_models_lists_the_generators(api: Any) -> None:
    assert sorted(m.id for m in api.models.list()) == [MODEL, JINJA, PLAIN]


def test_info_says_where_the_api_is(srv: ServerThread, grpc_client: Client) -> None:
    assert dict(grpc_client.info().endpoints)["openai"] == base_url(srv)


def test_completion_equals_generate(api: Any, grpc_client: Client) -> None:
    prompt = "the quick brown fox jumps over"
    tokens, text, last = generate(grpc_client, prompt=prompt, max_tokens=12)
    answer = api.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert answer.object == "text_completion" and answer.model == MODEL
    (choice,) = answer.choices
    assert choice.text == text
    assert choice.finish_reason == last.finish_reason.name.lower()
    assert answer.usage.prompt_tokens == last.usage.prompt_tokens
    assert answer.usage.completion_tokens == len(tokens)
    assert answer.usage.total_tokens == last.usage.prompt_tokens + len(tokens)

    stream = api.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == choice.finish_reason


def test_token_id_prompt_stop_and_seed(api: Any, grpc_client: Client) -> None:
    ids = [5, 17, 300, 42, 9, 1000]
    tokens, text, _ = generate(grpc_client, token_ids=ids, max_tokens=10, ignore_eos=True)
    answer = api.completions.create(
        model=MODEL, prompt=ids, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.choices[0].text == text and answer.usage.completion_tokens == len(tokens)
    stop = text[len(text) // 2 :][:3]
    if stop.strip():
        stopped = api.completions.create(
            model=MODEL,
            prompt=ids,
            max_tokens=10,
            temperature=0,
            stop=[stop],
            extra_body={"ignore_eos": True},
        )
        assert stop not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    sampled = [
        api.completions.create(
            model=MODEL, prompt=ids, max_tokens=8, temperature=1.0, top_p=0.9, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize("model", [MODEL, JINJA])
def test_chat_renders_the_template_as_transformers(
    api: Any, grpc_client: Client, repo: Path, model: str
) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(repo / model))
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if model == JINJA:
        rendered = tokenizer.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=False
        )
        assert rendered.startswith("[SYSTEM] You are terse.")  # transformers took the file
    tokens, text, _ = generate(grpc_client, token_ids=ids, max_tokens=10)
    answer = api.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=10, temperature=0
    )
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == text
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.usage.completion_tokens == len(tokens)

    chunks = list(
        api.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=10, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_logprobs_equal_generate(api: Any, grpc_client: Client, repo: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(repo / MODEL / "tokenizer.json"))
    prompt = "the quick brown fox jumps over"
    chunks = list(grpc_client.generate(MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                       logprobs=3))  # fmt: skip
    expected = [lp for c in chunks for lp in c.logprobs]
    ids = [lp.token_id for lp in expected]
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    answer = api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3
    )
    got = answer.choices[0].logprobs
    assert answer.choices[0].text == "".join(c.text for c in chunks)  # the same tokens
    assert got.tokens == texts
    assert got.token_logprobs == pytest.approx([lp.logprob for lp in expected], abs=1e-5)
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert got.text_offset == offsets
    for top, lp in zip(got.top_logprobs, expected, strict=True):
        alternatives = {tokenizer.decode([t.token_id], skip_special_tokens=False): t.logprob
                        for t in lp.top}  # fmt: skip
        assert set(alternatives) <= set(top) and len(top) <= 4
        assert [top[k] for k in alternatives] == pytest.approx(
            list(alternatives.values()), abs=1e-5
        )

    streamed = list(
        api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0, stream=True
        )
    )
    parts = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == texts
    assert [o for p in parts for o in p.text_offset] == offsets  # counted across chunks
    assert all(len(top) == 1 for p in parts for top in p.top_logprobs)  # the chosen token

    chat = api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert bytes(entry.bytes) == entry.token.encode()
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)  # greedy
    plain = api.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == chat.choices[0].message.content
    streamed_chat = list(
        api.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
            stream=True,
        )
    )  # fmt: skip
    entries = [
        e for c in streamed_chat if c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.token for e in entries] == [e.token for e in content]
    assert all(e.top_logprobs == [] for e in entries)

    for bad in (dict(top_logprobs=2), dict(logprobs=True, top_logprobs=21), dict(logprobs=3)):
        error = _error(
            lambda b=bad: api.chat.completions.create(model=MODEL, messages=MESSAGES, **b)
        )
        assert error.status_code == 400 and error.response.json()["error"]["param"] in (
            "logprobs",
            "top_logprobs",
        ), bad


def _error(call: Any) -> Any:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value


def test_errors_in_openai_shape(api: Any) -> None:
    cases = [
        (404, "not_found", dict(model="nope", prompt="hi")),
        (400, "invalid_argument", dict(model=MODEL, prompt="hi", n=2)),
        (400, "invalid_argument", dict(model=MODEL, prompt="hi", logprobs=21)),
        (400, "invalid_argument", dict(model=MODEL, prompt="hi", temperature=-1)),
        (400, "invalid_argument", dict(model=MODEL, prompt="hi", max_tokens=100_000)),
        (400, "invalid_argument", dict(model=MODEL, prompt=[1, 2, "three"])),
        (400, "invalid_argument", dict(model=MODEL, prompt=[True, 5])),
        (400, "invalid_argument", dict(model=MODEL, prompt="x" * 1_000_000)),  # from its size
        (404, "not_found", dict(model="nope", prompt=[5] * 100_000)),  # the model comes first
    ]
    for status, code, request in cases:
        error = _error(lambda r=request: api.completions.create(**r))
        assert error.status_code == status, request
        body = error.response.json()["error"]
        assert body["code"] == code and body["message"], body
        assert set(body) == {"message", "type", "param", "code"}
    chat_cases = [
        dict(model=PLAIN, messages=MESSAGES),  # no chat template
        dict(model=MODEL, messages=MESSAGES, n=2),
        dict(model=MODEL, messages=MESSAGES, response_format={"type": "xml"}),
        dict(
            model=MODEL,
            messages=MESSAGES,
            response_format={"type": "json_object"},
            n=1,
            extra_body={"guided_regex": "a+"},
        ),  # two constraints
        dict(
            model=MODEL,
            messages=MESSAGES,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        ),
        dict(model=MODEL, messages=[{"role": "robot", "content": "hi"}]),  # the template refuses
    ]
    for request in chat_cases:
        error = _error(lambda r=request: api.chat.completions.create(**r))
        assert error.status_code == 400, (request, error.response.text)
    assert "chat template" in _error(lambda: api.chat.completions.create(**chat_cases[0])).message


def test_bearer_tokens_and_rate_limits(srv: ServerThread) -> None:
    url = base_url(srv)
    anonymous = openai.OpenAI(base_url=url, api_key="x" * 20, max_retries=0)
    assert _error(lambda: anonymous.models.list()).status_code == 401
    plain_only = openai.OpenAI(base_url=url, api_key=PLAIN_ONLY, max_retries=0)
    assert [m.id for m in plain_only.models.list()] == [PLAIN]
    error = _error(lambda: plain_only.completions.create(model=MODEL, prompt="hi"))
    assert error.status_code == 403 and "may not use model" in error.message
    limited = openai.OpenAI(base_url=url, api_key=LIMITED, max_retries=0)
    limited.models.list()
    error = _error(lambda: limited.models.list())
    assert error.status_code == 429 and int(error.response.headers["retry-after"]) >= 1


def _curl(url: str, body: dict[str, Any]) -> tuple[int, str]:
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "-w",
            "\n%{http_code}",
            url,
            "-H",
            f"Authorization: Bearer {ADMIN}",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    text, _, status = done.stdout.rpartition("\n")
    return int(status), text


def test_curl_streams_server_sent_events(srv: ServerThread, grpc_client: Client) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    _, text, _ = generate(grpc_client, prompt="hello world", max_tokens=8)
    body = {
        "model": MODEL,
        "prompt": "hello world",
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    status, out = _curl(f"{base_url(srv)}/completions", body)
    assert status == 200
    events = [line for line in out.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    status, out = _curl(f"{base_url(srv)}/completions", {**body, "model": "nope"})
    assert status == 404 and json.loads(out)["error"]["code"] == "not_found"


def test_disconnect_frees_the_sequence(srv: ServerThread, grpc_client: Client) -> None:
    before = _generated(grpc_client)
    request = _long_completion(stream=True, token=ADMIN)
    with socket.create_connection(("127.0.0.1", srv.server.openai.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
    start = time.monotonic()
    status = wait_generator_idle(grpc_client, MODEL, timeout=5)
    assert (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0)
    assert time.monotonic() - start < 2
    assert _generated(grpc_client) - before < 1500  # aborted, not run to the end


def test_disconnect_before_a_whole_answer_frees_the_sequence(
    srv: ServerThread, grpc_client: Client
) -> None:
    before = _generated(grpc_client)
    request = _long_completion(stream=False, token=ADMIN)
    with socket.create_connection(("127.0.0.1", srv.server.openai.port), timeout=10) as sock:
        sock.sendall(request)
        deadline = time.monotonic() + 5
        while _generated(grpc_client) == before and time.monotonic() < deadline:
            time.sleep(0.005)  # until it runs
    status = wait_generator_idle(grpc_client, MODEL, timeout=5)
    assert (status.running, status.waiting, status.kv_cache.used_blocks) == (0, 0, 0)
    assert 0 < _generated(grpc_client) - before < 1500  # aborted, not run to the end


def _long_completion(stream: bool, token: str = "") -> bytes:
    """The raw HTTP/1.1 request of a completion of 2000 tokens (so it is still running when
    a test disconnects or drains), with a bearer token when given."""
    fields = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2000, "temperature": 0}
    body = json.dumps({**fields, "ignore_eos": True, "stream": stream}).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _generated(client: Client) -> int:
    (model,) = [m for m in client.info().models if m.name == MODEL]
    return int(model.generator.generated_tokens)


def test_drain_ends_streams_with_an_error_event(repo: Path) -> None:
    srv = serve(repo, openai__listen="127.0.0.1:0")
    port = srv.server.openai.port
    request = _long_completion(stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        received = sock.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        stopping = threading.Thread(target=srv.stop, kwargs={"grace": 1.0})
        stopping.start()
        while chunk := sock.recv(65536):
            received += chunk
        stopping.join(10)
    assert not stopping.is_alive() and time.monotonic() - start < 5
    last = received.rstrip().rsplit(b"data: ", 1)[1]
    error = json.loads(last.split(b"\r\n")[0])["error"]
    assert error["code"] == "unavailable" and "shutting down" in error["message"]
    with pytest.raises(OSError):  # no longer listening
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
