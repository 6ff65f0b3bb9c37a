"""The request bodies' Structs (service/protocols/schemas): one decode checks a body and its 400
names the field's path; the server's limits are set at start; the JSON Schemas /openapi.json
serves come from the same Structs and say what the decoder takes."""

from __future__ import annotations

import re

import msgspec
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from ringserve.service.kserve.bodies import InferParameters
from ringserve.service.protocols import errors, openapi_schemas
from ringserve.service.protocols.endpoint import Facts
from ringserve.service.protocols.schemas import (
    NOT_BLANK,
    components,
    convert,
    decode_bytes,
    message,
    server,
    v1,
)
from ringserve.service.request.errors import RequestError

BODIES = server.bodies(4, 3)


def refused(body: bytes, kind: type, subject: str = "body") -> str:
    with pytest.raises(RequestError) as err:
        decode_bytes(body, kind, subject)
    assert err.value.status == 400
    return err.value.message


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"texts": ["a", "b", "c", "d", "e"]}', "Expected `array` of length <= 4 - at `$.texts`"),
        (b'{"texts": []}', "Expected `array` of length >= 1 - at `$.texts`"),
        (b'{"texts": ["a", " \\u3000"]}', "texts[1] is empty"),
        (b'{"text": null}', "Expected `str`, got `null` - at `$.text`"),
        (
            b'{"text": "a", "truncate": "yes"}',
            "Expected `bool | null`, got `str` - at `$.truncate`",
        ),
        (b'{"text": "a", "truncation_direction": "up"}', "Invalid enum value 'up'"),
        (b"[1]", "body must be a JSON object"),
        (b'{"text": "a"', "malformed JSON"),
        (b'{"text": "caf\xe9"}', "body is not valid UTF-8"),
        (b'{"text": "\\ud800"}', "malformed JSON"),  # a lone surrogate is no text
    ],
)
def test_a_refusal_names_the_field(body: bytes, said: str) -> None:
    assert said in refused(body, BODIES.classify)


def test_integers_include_a_whole_float_and_say_int() -> None:
    """JSON Schema's integer includes 8.0; msgspec's int would refuse it, so a JSON integer is a
    float that is a multiple of 1, and the message still says int."""
    body = decode_bytes(b'{"input": "a", "dimensions": 8.0}', BODIES.openai_embeddings)
    assert body.dimensions == 8
    fraction = refused(b'{"input": "a", "dimensions": 8.5}', BODIES.openai_embeddings)
    assert fraction == "Expected `int`, got a fraction - at `$.dimensions`"
    assert "Expected `int` >= 1 - at `$.dimensions`" in refused(
        b'{"input": "a", "dimensions": 0}', BODIES.openai_embeddings
    )
    assert message("Expected `int`, got `float` - at `$.worker`").endswith(
        "got `float` - at `$.worker`"
    )


def test_limits_are_the_servers() -> None:
    """--max-texts and --max-documents narrow the Structs, under the same name."""
    small, large = server.bodies(2, 1), server.bodies(300, 50)
    assert small.classify.__name__ == large.classify.__name__ == "Classify"
    texts = b'{"query": "q", "texts": ["a", "b"]}'
    assert "length <= 1" in refused(texts, small.tei_rerank)
    assert decode_bytes(texts, large.tei_rerank).texts == ["a", "b"]
    assert server.bodies(2, 1) is small  # made once a pair of limits


def test_the_schema_says_what_the_decoder_takes() -> None:
    """Each body against its generated schema (jsonschema, 2020-12) and its Struct agree on a
    set of accepted and refused bodies."""
    refs, defs = components([BODIES.classify, BODIES.tei_rerank, BODIES.infer])
    tensor = '{"name": "text", "datatype": "%s", "shape": [1], "data": ["a"]}'
    cases = {
        BODIES.classify: [
            b'{"text": "a"}',
            b'{"texts": ["a", "b"], "version": 1}',
            b'{"text": " "}',
            b'{"texts": ["a", "b", "c", "d", "e"]}',
            b'{"text": "a", "truncate": 1}',
        ],
        BODIES.tei_rerank: [
            b'{"query": "q", "texts": ["a", {"text": "b"}]}',
            b'{"query": "q", "texts": [{"t": 1}]}',
            b'{"query": "q", "texts": ["a"], "top_n": 0}',
            b'{"query": "q", "texts": ["a"], "top_n": 2.0}',
        ],
        BODIES.infer: [
            b'{"inputs": [%s]}' % (tensor % "BYTES").encode(),
            b'{"inputs": [%s]}' % (tensor % "FP32").encode(),
            b'{"inputs": [], "parameters": {"timeout": 0}}',
        ],
    }
    for kind, ref in zip(cases, refs, strict=True):
        schema = {**ref, "components": {"schemas": defs}}
        validator = Draft202012Validator(schema)
        for body in cases[kind]:
            try:
                decode_bytes(body, kind)
                taken = True
            except RequestError:
                taken = False
            try:
                validator.validate(msgspec.json.decode(body))
                allowed = True
            except ValidationError:
                allowed = False
            assert taken == allowed, (kind.__name__, body, taken, allowed)


def test_blank_is_what_strip_removes() -> None:
    pattern = re.compile(NOT_BLANK)
    for text in ["\x1c", "\x85", " \u3000\t", "\ufeff", "a", " b ", "\u2028x"]:
        assert bool(pattern.search(text)) == bool(text.strip()), repr(text)


def test_grpc_parameters_get_the_same_checks() -> None:
    """gRPC's parameters (plain values from protobuf) go through the HTTP header's Struct."""
    got = convert({"timeout": 5, "priority": "bulk"}, InferParameters, "parameters")
    assert got.timeout == 5 and got.priority == "bulk"
    with pytest.raises(RequestError, match=r"Expected `int` >= 1 - at `\$\.parameters\.timeout`"):
        convert({"timeout": 0}, InferParameters, "parameters")
    with pytest.raises(RequestError, match=r"got `int` - at `\$\.parameters\.binary_data_output`"):
        convert({"binary_data_output": 1}, InferParameters, "parameters")


def test_the_answer_is_written_by_the_struct_its_schema_describes() -> None:
    """/v1/classify's answer (routes.classify encodes ClassifyResult) against the schema the
    same Struct gives for a model's labels: it passes, and fails with a field more or a label
    the model lacks."""
    refs, defs = components(list(v1.answers(("negative", "positive"), 4)))
    validator = Draft202012Validator({**refs[0], "components": {"schemas": defs}})
    one = v1.ClassifyResult(label="positive", label_id=1, scores=[0.25, 0.75])
    cut = v1.ClassifyResult(
        label="negative", label_id=0, scores=[0.5, 0.5], truncated=True, tokens=300
    )
    for answer in (one, cut):
        validator.validate(msgspec.json.decode(msgspec.json.encode(answer)))
    for bad in ({"planted": 1}, {"label": "neutral"}, {"scores": [1.0]}):
        with pytest.raises(ValidationError):
            validator.validate({**msgspec.to_builtins(one), **bad})


@pytest.mark.parametrize(
    ("path", "status", "fields"),
    [
        (b"/v1/classify", 400, {}),
        (b"/v1/classify", 413, {"tokens": 600, "max_length": 512}),
        (b"/v1/embeddings", 404, {}),
        (b"/v1/embeddings", 413, {"tokens": 600, "max_length": 512}),
        (b"/embed", 503, {}),
        (b"/rerank", 413, {"windows": 9, "max_windows": 8}),
        (b"/v2/embed", 400, {}),
        (b"/v2/rerank", 413, {"tokens": 600, "max_length": 512}),
    ],
)
def test_each_error_body_is_its_structs(path: bytes, status: int, fields: dict[str, int]) -> None:
    """errors.error_body writes each family's Struct, which /openapi.json's error schemas come
    from: the body passes its family's schema (with the counts only when a text was too long)
    and fails another family's, and a field more fails it."""
    kind = errors.family(path)
    plain, counted = errors.BODIES[kind]
    refs, defs = components([plain, counted])
    body = msgspec.json.decode(errors.error_body(path, status, "unknown model m", **fields))

    def validator(ref: dict[str, str]) -> Draft202012Validator:
        return Draft202012Validator({**ref, "components": {"schemas": defs}})

    validator(refs[1 if fields else 0]).validate(body)
    if fields:  # the counts are not in the plain body's schema
        with pytest.raises(ValidationError):
            validator(refs[0]).validate(body)
    with pytest.raises(ValidationError):
        validator(refs[0]).validate({**body, "planted": 1})
    others = [k for k in errors.BODIES if k != kind]
    for other in others:
        other_refs, other_defs = components(list(errors.BODIES[other]))
        check = Draft202012Validator({**other_refs[1], "components": {"schemas": other_defs}})
        assert not check.is_valid(body), (kind, other)


def test_two_structs_of_one_name_fail_the_document() -> None:
    """Components of one name from two Structs would overwrite each other silently: the
    document refuses them (a rerank `Document` beside the OpenAPI document's Struct did)."""
    f = Facts(
        model="m", labels=["a", "b"], tasks=["classify", "embed"], dimension=8, max_texts=4,
        max_documents=3, max_body=1000, version="1", server_version="0", key=False,
    )  # fmt: skip
    document = openapi_schemas.components(f)["OpenAPIDocument"]
    assert document["required"] == ["openapi", "info", "paths"]

    class Document(msgspec.Struct):  # the rerank document's name, another shape
        other: int

    _, defs = components([Document])
    with pytest.raises(ValueError, match="named Document"):
        openapi_schemas.merged([openapi_schemas.components(f), defs])
