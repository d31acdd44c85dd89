from __future__ import annotations

import pytest

from flotilla.kv_events import BlockStored, KVEventBatch
from policies.routing import ConfigError, RequestInfo, create_policy
from policies.routing.kv_index import KVIndex, KVIndexUser
from tests.policies.routing.harness import views

BS = 4
PROMPT = tuple(range(100, 116))  # four blocks of 4


def holding(index: KVIndex, backend: str, tokens: int) -> None:
    """`backend` stores the first `tokens` of PROMPT as one event."""
    event = BlockStored(block_hashes=list(range(tokens // BS)), parent_block_hash=None,
                        token_ids=list(PROMPT[:tokens]), block_size=BS, lora_id=None, medium="GPU", lora_name=None)
    index.apply_batch(backend, KVEventBatch(ts=0.0, events=[event]))


def bound(spec: str = "precise-prefix", *tracked: str) -> tuple[KVIndexUser, KVIndex]:
    policy = create_policy(spec)
    assert isinstance(policy, KVIndexUser)
    index = KVIndex()
    for url in tracked:
        index.add_backend(url)
    policy.bind_kv_index(index)
    return policy, index


def request(ids=PROMPT) -> RequestInfo:
    return RequestInfo(prompt_token_ids=ids, prompt_tokens=len(ids))


URLS = [f"http://replica-{i}" for i in range(3)]


def test_the_backend_whose_cache_holds_the_longest_prefix_wins():
    policy, index = bound("precise-prefix", *URLS)
    holding(index, URLS[1], 8)
    holding(index, URLS[2], 12)
    d = policy.select(views(3, in_flight=[0, 0, 2]), request())
    assert (d.index, d.rule, d.predicted_cached_tokens) == (2, "precise-match", 12)


def test_a_holder_out_of_bounds_yields_to_the_next_best_holder():
    policy, index = bound("precise-prefix:balance_abs_threshold=4", *URLS)
    holding(index, URLS[1], 8)
    holding(index, URLS[2], 12)
    d = policy.select(views(3, in_flight=[0, 3, 9]), request())
    assert (d.index, d.rule, d.predicted_cached_tokens) == (1, "load-bound", 8)


def test_both_parts_of_the_bound_must_hold():
    policy, index = bound("precise-prefix:balance_abs_threshold=4,balance_rel_threshold=3", *URLS)
    holding(index, URLS[2], 12)
    # 9 - 4 > 4 but 9 < 3 x 4: still within bounds
    d = policy.select(views(3, in_flight=[4, 5, 9]), request())
    assert (d.index, d.rule) == (2, "precise-match")


def test_no_cached_prefix_goes_to_the_least_loaded():
    policy, _ = bound("precise-prefix", *URLS)
    d = policy.select(views(3, in_flight=[2, 1, 3]), request())
    assert (d.index, d.rule, d.predicted_cached_tokens) == (1, "least-load", 0)


def test_the_bound_counts_the_routers_in_flight_requests_not_the_scraped_queue():
    # an engine with room runs everything at once: its waiting queue reads 0 while work piles up
    policy, index = bound("precise-prefix:balance_abs_threshold=2", *URLS)
    holding(index, URLS[0], 16)
    d = policy.select(views(3, in_flight=[9, 0, 0], num_requests_waiting=[0, 0, 0]), request())
    assert (d.index, d.rule) == (1, "load-bound")


def test_the_scraped_queue_remains_a_choice_of_signal():
    policy, index = bound("precise-prefix:signal=waiting,balance_abs_threshold=2", *URLS)
    holding(index, URLS[0], 16)
    d = policy.select(views(3, in_flight=[9, 0, 0], num_requests_waiting=[0, 0, 0]), request())
    assert (d.index, d.rule) == (0, "precise-match")


def test_new_requests_that_match_only_the_block_every_backend_holds_spread():
    policy, index = bound("precise-prefix", *URLS)
    for url in URLS:
        holding(index, url, BS)  # the shared first block: a system prompt every engine holds
    in_flight = [0, 0, 0]
    chosen = []
    for n in range(6):
        fresh = PROMPT[:BS] + tuple(range(1000 * (n + 1), 1000 * (n + 1) + 12))
        d = policy.select(views(3, in_flight=in_flight, num_requests_waiting=[0, 0, 0]), request(fresh))
        assert (d.rule, d.predicted_cached_tokens) == ("least-load", BS)
        in_flight[d.index] += 1
        chosen.append(d.index)
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2]


def test_ties_on_requests_go_to_fewer_reserved_tokens_then_less_prefill_done():
    policy, _ = bound("precise-prefix", *URLS)
    d = policy.select(views(3, in_flight_tokens=[900, 300, 300], prefill_tokens=[0, 5000, 100]), request())
    assert (d.index, d.rule) == (2, "least-load")


def test_a_longer_match_than_the_shared_blocks_wins_within_bounds():
    policy, index = bound("precise-prefix", *URLS)
    for url in URLS:
        holding(index, url, BS)
    holding(index, URLS[2], 12)
    d = policy.select(views(3, in_flight=[0, 0, 3]), request())
    assert (d.index, d.rule, d.predicted_cached_tokens) == (2, "precise-match", 12)


def test_backends_without_events_fall_back_to_the_approximate_index():
    policy, index = bound("precise-prefix:block_size_tokens=4", URLS[0])  # 1 and 2 publish nothing
    first = policy.select(views(3, in_flight=[5, 5, 0]), request())
    assert (first.index, first.rule) == (2, "least-load")
    again = policy.select(views(3, in_flight=[0, 0, 1]), request())
    assert (again.index, again.rule, again.predicted_cached_tokens) == (2, "approx-match", 16)


def test_a_tracked_backend_is_never_credited_from_the_routers_own_decisions():
    policy, _ = bound("precise-prefix", URLS[0])
    policy.select(views(1), request())
    d = policy.select(views(1), request())
    assert (d.rule, d.predicted_cached_tokens) == ("least-load", 0)


def test_lora_requests_match_only_their_adapters_blocks():
    policy, index = bound("precise-prefix", *URLS)
    holding(index, URLS[1], 16)
    d = policy.select(views(3), RequestInfo(prompt_token_ids=PROMPT, lora="sql"))
    assert d.rule == "least-load"


def test_without_a_bound_index_it_runs_on_the_approximate_index_alone():
    policy = create_policy("precise-prefix:block_size_tokens=4")
    policy.select(views(2, in_flight=[1, 0]), request())
    d = policy.select(views(2, in_flight=[0, 1]), request())
    assert (d.index, d.rule) == (1, "approx-match")


@pytest.mark.parametrize("spec", ["precise-prefix:balance_rel_threshold=0.5", "precise-prefix:signal=bogus",
                                  "precise-prefix:balance_abs_threshold=-1"])
def test_bad_parameters_are_refused_naming_the_field(spec):
    with pytest.raises(ConfigError):
        create_policy(spec)
