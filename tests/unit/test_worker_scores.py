"""A batch's answers packed at once (workers.process.answers.Scores) carry the same labels and score
bytes as each row packed alone."""

from __future__ import annotations

import numpy as np
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
