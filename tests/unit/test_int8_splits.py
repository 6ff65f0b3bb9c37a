"""int8's recipe is chosen on one split and its cost published from another: the two (and the
calibration rows) never share a text; the published intervals hold their figure, and a share
where every text agrees is not one point."""

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


def test_a_shares_interval_holds_it_and_narrows_with_rows() -> None:
    flips = np.array([1.0] * 10 + [0.0] * 990)  # 1% of decisions change
    low, high = int8.interval(flips)
    assert 0.0 < low < 0.01 < high < 0.02
    wide = int8.interval(flips[::10])  # a tenth of the rows: several times as wide
    assert wide[0] <= 0.01 <= wide[1] and wide[1] - wide[0] > 2.5 * (high - low)


def test_every_text_agreeing_is_not_an_interval_of_one_point() -> None:
    """3,793 of 3,793 agreeing: Wilson's interval, where the normal approximation said
    [1.0, 1.0]; none of 50: from 0 up, never below it."""
    assert int8.interval(np.ones(3793)) == [0.999, 1.0]
    low, high = int8.interval(np.zeros(50))
    assert low == 0.0 and 0.05 < high < 0.1


def test_a_paired_cost_with_no_text_changed_is_not_one_point_either() -> None:
    right = np.array([1.0] * 3000 + [0.0] * 793)
    assert int8.paired_interval(right, right) == [-0.0007, 0.0007]
    worse = right.copy()
    worse[:12] = 0.0  # 12 texts right under fp32 only, 4 under the other only
    worse[3000:3004] = 1.0
    cost = float((right - worse).mean())
    low, high = int8.paired_interval(right, worse)
    assert low < cost < high and low < 0 < high < 0.01


def test_other_values_get_the_normal_approximation() -> None:
    cosines = np.random.default_rng(0).uniform(0.5, 1.0, 2000)
    low, high = int8.interval(cosines)
    half = 1.96 * cosines.std(ddof=1) / np.sqrt(len(cosines))
    assert (high - low) / 2 == pytest.approx(half, rel=0.02)
    assert low < cosines.mean() < high
