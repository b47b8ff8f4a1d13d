"""The diversity figures of generated text (`tasks/text_evaluation.py`): n-gram entropy, distinct-n and seq-rep-n
against values counted by hand on tiny strings."""

import math

import pytest

from hackable_diffusion.tasks.text_evaluation import diversity, distinct_n, ngram_entropy_bits, ngrams, repetition_rate


def test_ngrams_of_a_string_in_order():
    assert ngrams("abcd", 2) == [("a", "b"), ("b", "c"), ("c", "d")]
    assert ngrams("ab", 3) == []
    assert ngrams([1, 2, 3], 3) == [(1, 2, 3)]


def test_ngram_entropy_of_hand_counted_strings():
    # pairs of "abab": ab twice, ba once -> the entropy of (2/3, 1/3)
    assert ngram_entropy_bits(["abab"], 2) == pytest.approx(-(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3))
    assert ngram_entropy_bits(["aabb"], 1) == pytest.approx(1.0)
    assert ngram_entropy_bits(["abab"], 3) == pytest.approx(1.0)  # aba, bab
    # no pair crosses from one sample into the next: "ab", "cd" give ab and cd (1 bit), not also bc (log2 3)
    assert ngram_entropy_bits(["ab", "cd"], 2) == pytest.approx(1.0)
    assert ngram_entropy_bits(["ab", "ab"], 2) == 0.0
    assert ngram_entropy_bits(["a"], 2) == 0.0
    assert ngram_entropy_bits([[1, 2, 1, 2]], 2) == ngram_entropy_bits(["abab"], 2)  # token ids or characters


def test_distinct_n_counts_distinct_over_all_ngrams_of_all_samples():
    # pairs of "abab" and "ab": ab, ba, ab, ab -> 2 distinct of 4
    assert distinct_n(["abab", "ab"], 2) == pytest.approx(0.5)
    assert distinct_n(["abab", "ab"], 3) == pytest.approx(1.0)  # aba, bab; "ab" has none
    assert distinct_n(["aaaa"], 1) == pytest.approx(0.25)
    assert distinct_n(["a"], 2) == 0.0


def test_repetition_rate_is_seq_rep_n_averaged_over_samples():
    # 4-grams of "abcabcab": abca bcab cabc abca bcab -> 3 distinct of 5, 2 repeat an earlier one: 0.4;
    # "abcde": abcd bcde, none repeats: 0; "ab" has no 4-gram and does not count
    assert repetition_rate(["abcabcab"]) == pytest.approx(0.4)
    assert repetition_rate(["abcabcab", "abcde", "ab"]) == pytest.approx(0.2)
    # per sample, not pooled: the same 4-gram in two samples is no repetition
    assert repetition_rate(["abcd", "abcd"]) == 0.0
    assert repetition_rate(["aaa"], 2) == pytest.approx(0.5)  # aa, aa
    assert repetition_rate(["ab"]) == 0.0


def test_diversity_reports_each_figure_and_a_bad_order_is_refused():
    out = diversity(["abcabcab", "abcde"])
    assert out == {
        "gen_bigram_entropy_bits": ngram_entropy_bits(["abcabcab", "abcde"], 2),
        "gen_trigram_entropy_bits": ngram_entropy_bits(["abcabcab", "abcde"], 3),
        "gen_distinct_2": distinct_n(["abcabcab", "abcde"], 2),
        "gen_distinct_3": distinct_n(["abcabcab", "abcde"], 3),
        "gen_seq_rep_4": pytest.approx(0.2),
    }
    # bigrams: ab x3, bc x3, ca x2, cd, de -> 5 distinct of 11
    assert out["gen_distinct_2"] == pytest.approx(5 / 11)
    for fn in (ngram_entropy_bits, distinct_n, repetition_rate):
        with pytest.raises(ValueError, match=r"n-gram order n=0 must be >= 1"):
            fn(["abc"], 0)
