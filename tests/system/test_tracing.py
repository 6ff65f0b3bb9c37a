"""OpenTelemetry traces against a real OTLP/HTTP receiver (tests/otlp.py, decoding with the
official protobuf definitions): the span tree and attributes of /v1, KServe and binary
requests, a `traceparent` continued, its sampled flag obeyed, and no span holding a key or a
text. One keyed server with tracing on serves the module."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from ringserve.wire.client import BinaryClient

from devkit.otlp import Receiver, Span
from devkit.server import ServerProc, serving, wait_for

pytestmark = pytest.mark.timeout(240)

KEY = "rs-trace-5b1e0c7d9a2f4e68"  # not secret: it exists only for this server
TENANT = "team-alpha"
CHILDREN = {"batch", "model"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, default_model: str, receiver: Receiver
) -> Iterator[ServerProc]:
    tmp = tmp_path_factory.mktemp("traced")
    keys = tmp / "keys.txt"
    keys.write_text(f"# the test's only key\n{KEY} tenant={TENANT}\n")
    os.chmod(keys, 0o600)
    args = ["--workers", "1", "--spares", "0", "--api-keys", str(keys)]
    args += ["--otlp-endpoint", receiver.url]
    env = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "ringserve-test"}
    with serving(ServerProc(tmp, args, env=env)) as srv:
        yield srv
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert KEY not in srv.logs()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def traceparent(n: int, sampled: bool = True) -> tuple[str, str, str]:
    trace_id = f"{0x4BF92F3577B34DA6A3CE929D0E0E4700 + n:032x}"
    parent = f"{0x00F067AA0BA90200 + n:016x}"
    return f"00-{trace_id}-{parent}-{'01' if sampled else '00'}", trace_id, parent


def tree(receiver: Receiver, trace_id: str) -> tuple[Span, dict[str, Span]]:
    """The request's span and its children, once all have arrived."""

    def whole() -> tuple[Span, dict[str, Span]] | None:
        spans = receiver.trace(trace_id)
        if {s.name for s in spans} < CHILDREN or len(spans) < 3:
            return None
        roots = [s for s in spans if s.name not in CHILDREN]
        assert len(roots) == 1 and len(spans) == 3, [s.name for s in spans]
        return roots[0], {s.name: s for s in spans if s.name in CHILDREN}

    found: tuple[Span, dict[str, Span]] = wait_for(whole, 30, f"the spans of {trace_id}")
    return found


def check_tree(root: Span, children: dict[str, Span]) -> None:
    """The batch is the request's child and the model the batch's; the stages in order:
    admission (to `admitted`), queue (to the batch), batch and model, then the write (from
    `answered` to the end), each inside the request's span."""
    assert root.kind == 2  # SPAN_KIND_SERVER
    b, m = children["batch"], children["model"]
    assert b.parent_id == root.span_id and m.parent_id == b.span_id
    admitted, _ = root.event("admitted")
    answered, _ = root.event("answered")
    assert root.start_ns <= admitted <= b.start_ns <= m.start_ns <= m.end_ns <= b.end_ns
    assert b.end_ns <= answered <= root.end_ns
    queue_us = (b.start_ns - admitted) // 1000
    assert 0 <= b.attributes["ringserve.queue.worker_us"] <= queue_us + 1
    rows = b.attributes["ringserve.batch.rows"]
    assert rows >= 1 and b.attributes["ringserve.batch.padded_tokens"] % rows == 0
    assert b.attributes["ringserve.batch.padded_tokens"] >= rows * 3  # [CLS] x [SEP] at least
    assert root.resource["service.name"] == "ringserve-test"
    assert root.resource["ringserve.runtime"] in ("onnx", "torch")


def tokens(root: Span) -> int:
    count: int = root.event("answered")[1]["ringserve.tokens"]
    return count


def test_v1_classify_continues_the_traceparent(traced: ServerProc, receiver: Receiver) -> None:
    header, trace_id, parent = traceparent(1)
    text = "a tender, quietly devastating portrait of a family"
    status, _, body = traced.request(
        "POST", "/v1/classify", {"text": text}, {**auth(), "traceparent": header}
    )
    assert status == 200, body
    root, children = tree(receiver, trace_id)
    assert root.parent_id == parent  # the caller's span is the parent: the trace is continued
    assert root.name == "POST /v1/classify"
    check_tree(root, children)
    attrs = root.attributes
    assert attrs["ringserve.protocol"] == "http"
    assert attrs["ringserve.tenant"] == TENANT
    assert attrs["ringserve.priority"] == "interactive"
    assert attrs["ringserve.texts"] == 1
    assert attrs["ringserve.text_bytes"] == len(text.encode())
    assert tokens(root) >= 8  # the text's tokens, special tokens included
    assert attrs["http.response.status_code"] == 200
    # The batch was padded to at least this text's own tokens.
    b = children["batch"].attributes
    assert b["ringserve.batch.padded_tokens"] // b["ringserve.batch.rows"] >= tokens(root)


def test_a_batch_request_and_a_lowered_priority(traced: ServerProc, receiver: Receiver) -> None:
    header, trace_id, _ = traceparent(2)
    texts = ["good", "bad", "a film of many small pleasures"]
    headers = {**auth(), "traceparent": header, "X-Priority": "bulk"}
    status, _, body = traced.request("POST", "/v1/classify", {"texts": texts}, headers)
    assert status == 200, body
    root, children = tree(receiver, trace_id)
    check_tree(root, children)
    assert root.attributes["ringserve.texts"] == 3
    assert root.attributes["ringserve.priority"] == "bulk"


def test_kserve_infer_is_traced(traced: ServerProc, receiver: Receiver) -> None:
    header, trace_id, parent = traceparent(3)
    name = json.loads(traced.request("GET", "/v1/model", headers=auth())[2])["name"]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{traced.port}")
    try:
        inp = httpclient.InferInput("text", [2], "BYTES")
        inp.set_data_from_numpy(np.array([b"lovely", b"dreadful"], dtype=object))
        result = client.infer(name, [inp], headers={**auth(), "traceparent": header})
        assert result.as_numpy("scores").shape == (2, 2)
    finally:
        client.close()
    root, children = tree(receiver, trace_id)
    assert root.parent_id == parent
    assert root.name == f"POST /v2/models/{name}/infer"
    assert root.attributes["ringserve.protocol"] == "kserve"
    assert root.attributes["ringserve.texts"] == 2
    check_tree(root, children)


def test_binary_frames_are_traced(traced: ServerProc, receiver: Receiver) -> None:
    before = {s.trace_id for s in receiver.all() if s.name == "binary frame"}
    texts = ["first frame", "second frame, a little longer", "third"]
    with BinaryClient("127.0.0.1", traced.binary_port, api_key=KEY) as client:
        answers = client.classify_many(texts)
    assert all(a.ok for a in answers)

    def frames() -> list[Span] | None:
        roots = [s for s in receiver.all() if s.name == "binary frame"]
        new = [s for s in roots if s.trace_id not in before]
        ready = len(new) == len(texts) and all(len(receiver.trace(s.trace_id)) == 3 for s in new)
        return new if ready else None

    roots = wait_for(frames, 30, "three binary frame traces")
    assert sorted(r.attributes["ringserve.text_bytes"] for r in roots) == sorted(
        len(t) for t in texts
    )
    for root in roots:
        assert root.parent_id == ""  # a frame carries no traceparent: a trace of its own
        assert root.attributes["ringserve.protocol"] == "binary"
        assert root.attributes["ringserve.tenant"] == TENANT
        spans = receiver.trace(root.trace_id)
        check_tree(root, {s.name: s for s in spans if s is not root})


def test_an_unsampled_parent_is_not_recorded(traced: ServerProc, receiver: Receiver) -> None:
    """The default sampler (parentbased_always_on) follows the caller's sampled flag."""
    off, off_id, _ = traceparent(4, sampled=False)
    on, on_id, _ = traceparent(5)
    for header in (off, on):
        status, _, _ = traced.request(
            "POST", "/v1/classify", {"text": "fine"}, {**auth(), "traceparent": header}
        )
        assert status == 200
    tree(receiver, on_id)  # exported after the unsampled one would have been
    assert receiver.trace(off_id) == []


def test_refusals_are_traced_too(traced: ServerProc, receiver: Receiver) -> None:
    header, trace_id, _ = traceparent(6)
    status, _, _ = traced.request(
        "POST", "/v1/classify", {"text": "ok"}, {**auth(), "traceparent": header, "X-Priority": "x"}
    )
    assert status == 400  # a bad X-Priority is refused before admission: no span
    header, trace_id, _ = traceparent(7)
    status, _, body = traced.request(
        "POST",
        "/v1/classify",
        {"text": "late"},
        {**auth(), "traceparent": header, "X-Request-Timeout-Ms": "0.001"},
    )
    assert status == 504, body
    root = wait_for(
        lambda: [s for s in receiver.trace(trace_id) if s.name == "POST /v1/classify"], 30, "504"
    )[0]
    assert root.attributes["http.response.status_code"] == 504


def test_no_span_holds_a_key_or_a_text(traced: ServerProc, receiver: Receiver) -> None:
    """Run last: every byte exported so far, searched for the key and each text sent."""
    wait_for(lambda: len(receiver.all()) >= 15, 30, "the module's spans")
    secrets = [KEY, "quietly devastating", "many small pleasures", "lovely", "dreadful"]
    secrets += ["second frame", "Bearer"]
    for body in receiver.bodies:
        for s in secrets:
            assert s.encode() not in body, s
    for span in receiver.all():
        for value in span.attributes.values():
            assert not (isinstance(value, str) and any(s in value for s in secrets))


def test_tracing_off_imports_no_sdk(tmp_path: Path) -> None:
    """Off, the server never imports the SDK (checked in-process, as the front-end would)."""
    import subprocess
    import sys

    code = (
        "import sys; from ringserve.service.ops import tracing; from ringserve.service import app; "
        "assert not tracing.wanted(None, {}); "
        "assert tracing.wanted(None, {'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://x:4318'}); "
        "assert not tracing.wanted('http://x', {'OTEL_SDK_DISABLED': 'true'}); "
        "assert tracing.traces_url('http://h:4318') == 'http://h:4318/v1/traces'; "
        "assert tracing.traces_url('http://h:4318/custom') == 'http://h:4318/custom'; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
