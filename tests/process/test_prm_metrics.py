"""PRM metrics against hand-worked values (grpokit.process.prm_metrics)."""

import itertools

import pytest

from grpokit.process.prm_metrics import auc, first_wrong_step, prm_metrics


def _auc_by_pairs(scores, labels):
    """The definition: every (good, bad) pair, 1 if the good step scores higher, 1/2 if tied."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_by_hand_and_against_the_pair_count():
    # pairs (good 0.9, 0.4) x (bad 0.4, 0.1): 1 + 1 + 0.5 + 1 = 3.5 of 4
    assert auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == 0.875
    assert auc([0.1, 0.9], [1, 0]) == 0.0
    assert auc([0.5, 0.5, 0.5], [1, 0, 1]) == 0.5
    assert auc([0.3, 0.2], [1, 1]) is None and auc([], []) is None
    scores = [0.1, 0.7, 0.3, 0.7, 0.9, 0.2, 0.3, 0.3, 0.8, 0.05]
    labels = [0, 1, 0, 0, 1, 1, 1, 0, 1, 0]
    assert auc(scores, labels) == pytest.approx(_auc_by_pairs(scores, labels))
    with pytest.raises(ValueError, match="3 scores but 2 labels"):
        auc([1, 2, 3], [1, 0])


def test_first_wrong_step():
    assert first_wrong_step([1, 1, 0, 0]) == 2
    assert first_wrong_step([]) == -1
    assert first_wrong_step([0.5, 0.49]) == 1  # the threshold itself counts as good


def test_prm_metrics_by_hand():
    scores = [
        [0.9, 0.8, 0.2],  # labels 1 1 0: first wrong 2, predicted 2 -> hit
        [0.9, 0.3, 0.9],  # labels 1 1 1: all good, predicted 1 -> miss
        [0.6, 0.7],  # labels 1 1: all good, predicted -1 -> hit
        [0.4, 0.1],  # labels 1 0: first wrong 1, predicted 0 -> miss
        [0.9, None],  # labels 1 0: an unscored step -> left out of F1, its scored step counted
        [],  # no steps: nothing
    ]
    labels = [[1, 1, 0], [1, 1, 1], [1, 1], [1, 0], [1, 0], []]
    m = prm_metrics(scores, labels)
    assert m["steps"] == 11 and m["steps_unscored"] == 1
    assert m["good_frac"] == pytest.approx(9 / 11)
    # right: .9 .8 .2 | .9 . .9 | .6 .7 | . .1 | .9  -> wrong: 0.3 (label 1), 0.4 (label 1) -> 9/11
    assert m["step_accuracy"] == pytest.approx(9 / 11)
    flat_s = [0.9, 0.8, 0.2, 0.9, 0.3, 0.9, 0.6, 0.7, 0.4, 0.1, 0.9]
    flat_y = [1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1]
    assert m["auc"] == pytest.approx(_auc_by_pairs(flat_s, flat_y))
    assert m["solutions"] == 4 and m["solutions_unscored"] == 1
    assert m["acc_erroneous"] == 0.5 and m["acc_correct"] == 0.5
    assert m["first_wrong_f1"] == pytest.approx(0.5)


def test_f1_is_the_harmonic_mean_and_undefined_without_a_side():
    m = prm_metrics([[0.1], [0.9], [0.9]], [[0], [1], [0]])  # erroneous 1/2, correct 1/1
    assert m["acc_erroneous"] == 0.5 and m["acc_correct"] == 1.0
    assert m["first_wrong_f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert prm_metrics([[0.2, 0.9], [0.9, 0.9]], [[1, 1], [1, 1]])["acc_correct"] == 0.5  # first step flagged
    assert prm_metrics([[0.9]], [[1]])["first_wrong_f1"] is None
    assert prm_metrics([[0.9]], [[0]])["first_wrong_f1"] is None
    assert prm_metrics([[0.9]], [[0]])["acc_erroneous"] == 0.0
    empty = prm_metrics([], [])
    assert empty["steps"] == 0 and empty["step_accuracy"] is None and empty["auc"] is None


@pytest.mark.parametrize(
    "scores, labels, match",
    [
        ([[0.1]], [], "1 score lists but 0 label lists"),
        ([[0.1, 0.2]], [[1]], "solution 0 has 2 scores but 1 labels"),
        ([[0.1]], [[2]], "solution 0 has a label not in"),
    ],
)
def test_bad_input_is_named(scores, labels, match):
    with pytest.raises(ValueError, match=match):
        prm_metrics(scores, labels)
