"""Structured output over a real server, in both process modes: a corpus of bounded JSON
schemas answered by the demo model and a tiny random Hugging Face export, every reply
valid (jsonschema), greedy and sampled, alone and 16 at once with the same tokens; regular
expressions, choices and grammars; the official openai client's response_format and
parse, and LangChain's with_structured_output; refusals with the compiler's message."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pydantic
import pytest

from tensord_client import Client, TensordError
from tests.conftest import ServerThread, serve, wait_generator_idle
from tests.hf_families import ExportCache
from tests.models import small_generator
from tests.structured_schemas import MAX_TOKENS, SCHEMAS

MODEL = "tinylm"
TIGHT = "tinylm_tight"
"""Small constraint limits and a KV pool that preempts four sequences."""
HF = "llama"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
PROMPTS = ["the quick brown fox", "a list of", "once upon a time", "reply:"]


@pytest.fixture(scope="module")
def repo(
    demo_repo: Path, hf_exports: ExportCache, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("structured-repo")
    small_generator(demo_repo, root, MODEL)
    small_generator(
        demo_repo,
        root,
        TIGHT,
        "max_constraint_bytes = 150000\nconstraint_compile_seconds = 0.25\nnum_blocks = 16\n"
        "max_model_len = 256\n",
    )
    (root / TIGHT / "model.toml").write_text(
        (root / TIGHT / "model.toml").read_text().replace("num_blocks = 160\n", "")
    )
    config_path = root / MODEL / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    shutil.copytree(hf_exports.get(HF), root / HF)
    return root


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[ServerThread]:
    server = serve(repo, openai__listen="127.0.0.1:0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> Iterator[Client]:
    with Client(srv.target, timeout=60, retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def openai_url(client: Client) -> str:
    return dict(client.info().endpoints)["openai"]


def run(
    client: Client,
    model: str,
    constraint: dict[str, Any],
    prompt: str = PROMPTS[0],
    **sampling: Any,
) -> tuple[list[int], str, str]:
    """Token ids, text and finish reason of one constrained Generate."""
    sampling.setdefault("max_tokens", MAX_TOKENS)
    sampling.setdefault("temperature", 0)
    chunks = list(client.generate(model, prompt, constraint=constraint, **sampling))
    text = "".join(c.text for c in chunks)
    return [t for c in chunks for t in c.token_ids], text, str(chunks[-1].finish_reason)


def corpus(client: Client, model: str, together: bool, **sampling: Any) -> dict[str, Any]:
    """Each schema's reply (tokens, text, finish), alone one after another or 16 at once."""
    names = sorted(SCHEMAS)

    def one(i: int) -> tuple[list[int], str, str]:
        name = names[i]
        seeded = {"seed": 1000 + i, **sampling} if sampling else {}
        prompt = PROMPTS[i % len(PROMPTS)]
        return run(client, model, {"json_schema": SCHEMAS[name]}, prompt, **seeded)

    if together:
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(one, range(len(names))))
    else:
        replies = [one(i) for i in range(len(names))]
    return dict(zip(names, replies, strict=True))


def check_valid(replies: dict[str, Any]) -> None:
    for name, (_, text, finish) in replies.items():
        assert finish == "STOP", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])


@pytest.mark.parametrize("model", [MODEL, HF])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_every_reply_validates_alone_and_16_at_once(
    client: Client, model: str, sampled: bool
) -> None:
    assert len(SCHEMAS) >= 30
    sampling = {"temperature": 1.0, "top_p": 0.95} if sampled else {}
    alone = corpus(client, model, together=False, **sampling)
    check_valid(alone)
    together = corpus(client, model, together=True, **sampling)
    assert together == alone  # the constraint is per row: batching changes nothing


def test_regex_choice_grammar_and_json_object(client: Client) -> None:
    _, text, finish = run(client, MODEL, {"regex": "[a-c]{2,5}-[0-9]{1,3}"})
    assert re.fullmatch("[a-c]{2,5}-[0-9]{1,3}", text) and finish == "STOP"
    for prompt in PROMPTS:
        _, text, finish = run(client, MODEL, {"choice": ["yes", "no", "maybe"]}, prompt)
        assert text in ("yes", "no", "maybe") and finish == "STOP"
    grammar = 'start: greeting " " name "!"\ngreeting: "hi" | "hello"\nname: /[A-Z][a-z]{1,5}/'
    _, text, finish = run(client, MODEL, {"grammar": grammar})
    assert re.fullmatch("(hi|hello) [A-Z][a-z]{1,5}!", text) and finish == "STOP"
    _, text, finish = run(client, MODEL, {"json_object": True}, max_tokens=60)
    if finish == "STOP":  # an object with free-form keys may run to the limit
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{") and finish == "LENGTH"


def test_a_structure_complete_ends_with_stop(client: Client) -> None:
    """A constraint that allows only the end of sequence ends the stream with STOP."""
    tokens, text, finish = run(client, MODEL, {"choice": ["ok"]})
    assert (text, finish) == ("ok", "STOP") and 1 <= len(tokens) <= 2


def test_constraints_with_stop_strings_logprobs_and_preemption(client: Client) -> None:
    schema = SCHEMAS["mixed_record"]
    _, text, finish = run(client, MODEL, {"json_schema": schema}, stop=['"name"'])
    assert finish == "STOP" and '"name"' not in text
    constraint = {"json_schema": schema}
    chunks = list(
        client.generate(MODEL, PROMPTS[1], constraint=constraint, max_tokens=MAX_TOKENS,
                        temperature=0, logprobs=2)
    )  # fmt: skip
    assert all(lp.logprob <= 0 for c in chunks for lp in c.logprobs)
    jsonschema.validate(json.loads("".join(c.text for c in chunks)), schema)
    # Sixteen blocks of 16 tokens take two prompts of about 100 tokens, not their replies:
    # sequences are preempted and recomputed, their matchers kept where they stood.
    names = ["nested", "mixed_record", "defs_nested_ref", "array_of_objects"]

    def tight(name: str) -> tuple[list[int], str, str]:
        prompt = f"{name}: " + "x y " * 35
        return run(client, TIGHT, {"json_schema": SCHEMAS[name]}, prompt, max_tokens=100)

    alone = {n: tight(n) for n in names}
    with ThreadPoolExecutor(4) as pool:
        together = dict(zip(names, pool.map(tight, names), strict=True))
    assert together == alone
    for name, (_, text, _) in together.items():
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    status = wait_generator_idle(client, TIGHT)
    assert status.preemptions > 0 and status.kv_cache.used_blocks == 0


@pytest.mark.parametrize("model", [MODEL, HF])
def test_prefix_reuse_with_constraints(client: Client, model: str) -> None:
    """A prompt whose blocks were computed before (the paged pool's prefix cache, or the
    host prefix store of KV slots) gives the same constrained reply."""
    prompt = "a long shared preamble of words " * 4
    schema = SCHEMAS["mixed_record"]
    first = run(client, model, {"json_schema": schema}, prompt)
    (info,) = [m for m in client.info().models if m.name == model]
    hits = info.generator.prefix_hit_tokens
    again = run(client, model, {"json_schema": schema}, prompt)
    (info,) = [m for m in client.info().models if m.name == model]
    assert info.generator.prefix_hit_tokens >= hits + 16
    assert again == first
    jsonschema.validate(json.loads(first[1]), schema)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"json_schema": "{not json"}, "the JSON schema is not valid JSON"),
        ({"json_schema": {"$ref": "#/nowhere"}}, "the json_schema constraint is refused"),
        ({"regex": "(("}, "the regex constraint is refused"),
        ({"grammar": "start: missing"}, "the grammar constraint is refused"),
        ({"choice": []}, "choices must be a non-empty list"),
    ],
)
def test_bad_constraints_are_invalid_argument(
    client: Client, constraint: dict[str, Any], message: str
) -> None:
    for _ in range(2):  # the second time from the cache of refusals
        with pytest.raises(TensordError) as error:
            run(client, MODEL, constraint)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.value.details()


def _properties(count: int) -> dict[str, Any]:
    patterns = {
        f"k{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}$"} for i in range(count)
    }
    return {"type": "object", "properties": patterns}


def test_constraints_that_fail_while_generating_are_invalid_argument(client: Client) -> None:
    """A matcher that cannot go on (an unsatisfiable expression, a bound llguidance cannot
    take) ends its request with INVALID_ARGUMENT; the daemon serves on."""
    for constraint, message in [
        ({"regex": "[^\\s\\S]"}, "the constraint cannot go on"),
        ({"json_schema": {"type": "integer", "minimum": -1e19, "maximum": -1e19}}, "2^53"),
    ]:
        with pytest.raises(TensordError) as error:
            run(client, MODEL, constraint, max_tokens=5)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
        assert message in error.value.details()
    # A repetition penalty that pushes allowed tokens far down leaves masked ones masked.
    schema = SCHEMAS["person"]
    _, text, _ = run(client, MODEL, {"json_schema": schema}, "a b c 0 1 2 { } : ,",
                     repetition_penalty=1e38)  # fmt: skip
    jsonschema.validate(json.loads(text), schema)
    assert run(client, MODEL, {"choice": ["still"]})[1] == "still"


def test_limits_refuse_large_and_slow_constraints(client: Client) -> None:
    assert run(client, TIGHT, {"choice": ["warm"]}, max_tokens=8)[1] == "warm"
    with pytest.raises(TensordError) as error:
        run(client, TIGHT, {"json_schema": _properties(3000)}, max_tokens=8)  # ~160 kB
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_constraint_bytes" in error.value.details()
    with pytest.raises(TensordError) as error:  # ~107 kB, about half a second to compile
        run(client, TIGHT, {"json_schema": _properties(2000)}, max_tokens=8)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "constraint_compile_seconds" in error.value.details()
    with pytest.raises(TensordError) as error:
        run(client, MODEL, {"choice": ["a"]}, ignore_eos=True)
    assert "ignore_eos cannot go with a constraint" in error.value.details()
    assert run(client, TIGHT, {"choice": ["fine"]}, max_tokens=8)[1] == "fine"  # still serving
    assert wait_generator_idle(client, TIGHT).kv_cache.used_blocks == 0


def test_info_lists_the_constraint_kinds(client: Client) -> None:
    (info,) = [m for m in client.info().models if m.name == MODEL]
    assert list(info.generator.constraints) == [
        "json_schema", "json_object", "regex", "choice", "grammar"
    ]  # fmt: skip


def test_openai_response_format_and_parse(openai_url: str) -> None:
    openai = pytest.importorskip("openai")

    class Pet(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=8)
        legs: int = pydantic.Field(ge=0, le=8)

    api = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Describe a pet as JSON."}]
    schema = SCHEMAS["person"]
    reply = api.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    reply = api.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, temperature=0,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert reply.choices[0].message.content.startswith("{")
    parsed = api.chat.completions.parse(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0, response_format=Pet
    )
    pet = parsed.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8
    stream = api.completions.create(
        model=MODEL, prompt="pick:", max_tokens=20, temperature=0, stream=True,
        extra_body={"guided_choice": ["left", "right"]},
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in stream) in ("left", "right")
    with pytest.raises(openai.BadRequestError) as bad:
        api.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=10,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"$ref": "#/missing"}}}}},
        )  # fmt: skip
    assert "refused" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as bad:
        api.chat.completions.create(model=MODEL, messages=messages, response_format={"type": "xml"})
    assert "response_format.type" in str(bad.value)


def test_langchain_with_structured_output(openai_url: str) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")

    class City(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=10)
        population: int = pydantic.Field(ge=0, le=1000)

    llm = langchain_openai.ChatOpenAI(
        model=MODEL, base_url=openai_url, api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
        max_retries=0,
    )  # fmt: skip
    city = llm.with_structured_output(City, method="json_schema").invoke("Name a city.")
    assert isinstance(city, City) and 0 <= city.population <= 1000
