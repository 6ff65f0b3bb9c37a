"""int8's recipe is chosen on one split and its cost published from another: the two (and the
calibration rows) never share a text, and the published interval is the mean's."""

from __future__ import annotations

import numpy as np
import pytest
from ringserve.factory import int8
from ringserve.factory import onnx as ox


def test_calibration_selection_and_publication_never_share_a_text() -> None:
    calibration = set(int8._rows(int8.CALIBRATION))
    selection_rows = ox.read_heldout()[0]
    selection = set(selection_rows)
    publication, labels = ox.read_heldout(ox.PUBLICATION)
    assert (len(calibration), len(selection_rows), len(publication)) == (300, 1000, 3793)
    assert len(set(publication)) == len(publication) and set(labels) == {0, 1}
    assert not calibration & selection
    assert not calibration & set(publication)
    assert not selection & set(publication)


def test_the_interval_is_the_means_and_narrows_with_rows() -> None:
    flips = np.array([1.0] * 10 + [0.0] * 990)  # 1% of decisions change
    low, high = int8.interval(flips)
    assert low < 0.01 < high
    wide = int8.interval(flips[::10])  # a tenth of the rows: about three times as wide
    assert wide[1] - wide[0] == pytest.approx(np.sqrt(10) * (high - low), rel=0.1)
    assert int8.interval(np.zeros(50)) == [0.0, 0.0]
