"""A batch's answers packed at once (workers.process.answers.Scores) carry the same labels and score
bytes as each row packed alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ringserve.workers.process.answers import Scores


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    extra=st.integers(0, 3),
    labels=st.integers(1, 5),
    embed=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_a_batch_of_scores_packs_as_its_rows_alone(
    rows: int, extra: int, labels: int, embed: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    probs = rng.random((rows + extra, labels + embed), dtype=np.float32)
    probs[0, : min(2, labels)] = 0.5  # a tie: the first of the equal scores wins, as argmax
    scores = Scores(probs, rows, labels)
    for i in range(rows):
        alone = np.ascontiguousarray(probs[i][:labels], dtype=np.float32)
        assert scores.labels[i] == int(alone.argmax())
        assert scores.row(i) == alone.tobytes()


def test_a_model_without_labels_has_no_scores_to_pack() -> None:
    scores = Scores(np.zeros((3, 4), dtype=np.float32), 2, 0)
    assert scores.labels == [0, 0] and scores.row(1) == b""


def test_one_pass_answers_read_back_as_scores_and_vector() -> None:
    """OPT_BOTH: the worker packs a row's C scores and D floats in one record, its label the
    scores' argmax (not the vector's); the front-end reads it back and KServe's answer cuts
    each record where it writes it: the scores' columns, then the vector."""
    from ringserve.service.engine.requests import Result
    from ringserve.service.kserve.encoder import OutputEncoder
    from ringserve.shm import layout as L
    from ringserve.workers.process.answers import pack

    rows = np.array([[0.2, 0.8, 5.0, -1.0, 2.0], [0.9, 0.1, -3.0, 7.0, 1.0]], dtype=np.float32)
    results = []
    for i, row in enumerate(rows):
        _, payload, _, _ = pack(i, L.STATUS_OK, probs=row, scored=2)
        results.append(Result.from_ring(0, payload, 0))
    assert [r.label_id for r in results] == [1, 0]
    wanted = [("scores", False), ("label", False), ("embedding", True)]
    tensors, blobs = OutputEncoder(["neg", "pos"]).tensors(results, wanted, joined=True)
    assert tensors[0]["shape"] == [2, 2] and tensors[0]["data"] == rows[:, :2].ravel().tolist()
    assert tensors[1]["data"] == ["pos", "neg"]
    assert tensors[2]["shape"] == [2, 3] and blobs == [rows[:, 2:].tobytes()]


def test_token_vectors_read_back_as_k_rows() -> None:
    """OPT_TOKENS: a text's first k rows of the batch's states (right padded), flagged
    RSP_TOKENS with n = H and windows = k; the front-end reads k x H floats back."""
    from ringserve.service.engine.requests import Result
    from ringserve.service.protocols.tei_api import token_matrix
    from ringserve.shm import layout as L
    from ringserve.workers.batches import Item
    from ringserve.workers.process.answers import token_answer

    states = np.random.default_rng(3).random((6, 4), dtype=np.float32)  # length 6, H = 4
    item = Item(7, 0, 0, [101, 5, 6, 102], tokens=4, token_vectors=True)
    msg_id, payload, _, _ = token_answer(item, states, 0, 0, 0, 0)
    result = Result.from_ring(0, payload, 0)
    assert msg_id == 7 and result.flags & L.RSP_TOKENS and result.windows == 4
    np.testing.assert_array_equal(token_matrix(result), states[:4])


def test_embed_all_tokenizes_only_requests_whose_cap_could_pass_the_bound(tmp_path: Path) -> None:
    """No text gives more than max_length token vectors, so a request whose texts could not
    pass MAX_TOKEN_FLOATS at that many is admitted without the front-end tokenizing it; past
    that, the tokenizer is read (here an artifact without one: 500) for the 413's exact count."""
    from types import SimpleNamespace

    from ringserve.service.protocols.tei_api import MAX_TOKEN_FLOATS, check_token_floats
    from ringserve.service.request.errors import RequestError

    manifest = SimpleNamespace(max_length=256, fingerprint="x")
    info = SimpleNamespace(manifest=manifest, model_dir=str(tmp_path), name="m")
    fits = MAX_TOKEN_FLOATS // (256 * 384)
    check_token_floats(info, [b"word " * 10_000] * fits, 384)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as refused:
        check_token_floats(info, [b"word"] * (fits + 1), 384)  # type: ignore[arg-type]
    assert refused.value.status == 500 and "model m" in refused.value.message
