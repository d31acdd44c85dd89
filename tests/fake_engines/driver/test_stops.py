"""Stop strings cut streamed text before the first match, also across token boundaries."""

from __future__ import annotations

from fake_engines.driver.stops import cut_at_stop


def test_no_stop_passes_the_text_through():
    assert cut_at_stop("the ", "cat ", ["dog"]) == ("cat ", None)


def test_match_inside_the_new_text_keeps_what_comes_before():
    assert cut_at_stop("the ", "cat sat", ["sat", "cat"]) == ("", "cat")
    assert cut_at_stop("the ", "big cat", ["cat"]) == ("big ", "cat")


def test_match_spanning_tokens_sends_nothing_more():
    assert cut_at_stop("the ca", "t sat", ["cat"]) == ("", "cat")


def test_empty_stop_strings_are_ignored():
    assert cut_at_stop("", "abc", [""]) == ("abc", None)
