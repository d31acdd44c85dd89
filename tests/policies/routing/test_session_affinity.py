from __future__ import annotations

from policies.routing import RequestInfo, create_policy, session_key_from
from policies.routing.hash_ring import stable_hash
from tests.policies.routing.harness import views


def decide(spec: str, backends, **request):
    d = create_policy(spec).select(backends, RequestInfo(**request))
    return d.index, d.rule


def test_modulo_home_is_the_integer_session_id_mod_backends():
    assert decide("session-affinity:home=modulo", views(4, in_flight=[0, 9, 9, 9]), session_key="5") == (1, "home")
    key = "agent-x"
    assert decide("session-affinity:home=modulo", views(4), session_key=key) == (stable_hash(key) % 4, "home")


def test_request_without_session_goes_to_least_loaded_as_new_session():
    assert decide("session-affinity", views(3, in_flight=[2, 0, 1])) == (1, "new-session")


def test_configured_header_wins_over_parsed_key():
    backends = views(4)
    headers = {"X-Agent": "7"}
    spec = "session-affinity:home=modulo,header=x-agent"
    assert decide(spec, backends, session_key="1", headers=headers) == (3, "home")
    assert decide("session-affinity:home=modulo", backends, session_key="1", headers=headers) == (1, "home")


def test_session_key_comes_from_header_else_body_user():
    assert session_key_from({"X-Session-Id": "abc"}, {"user": "u1"}, "x-session-id") == "abc"
    assert session_key_from({}, {"user": "u1"}, "x-session-id") == "u1"
    assert session_key_from({}, {}, "x-session-id") is None


def test_bound_sends_overloaded_home_to_least_loaded():
    backends = views(4, in_flight=[10, 0, 1, 2])  # mean 3.25; bound 1.25 -> 4.0625
    spec = "session-affinity:home=modulo,bound=1.25"
    assert decide(spec, backends, session_key="0") == (1, "bound")
    assert decide(spec, backends, session_key="3") == (3, "home")


def test_ring_home_is_stable_and_a_new_backend_only_takes_keys():
    policy = create_policy("session-affinity")
    four, five = views(4), views(5)
    keys = [f"session-{i}" for i in range(400)]
    before = {k: policy.select(four, RequestInfo(session_key=k)).index for k in keys}
    again = {k: policy.select(four, RequestInfo(session_key=k)).index for k in keys}
    after = {k: policy.select(five, RequestInfo(session_key=k)).index for k in keys}
    assert before == again
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == 4 for k in moved)
    assert 40 <= len(moved) <= 140  # about a fifth of 400
    assert len(set(before.values())) == 4


def test_session_moves_off_a_missing_home_and_back_when_it_returns():
    policy = create_policy("session-affinity")
    backends = views(3)
    home = policy.select(backends, RequestInfo(session_key="s")).index
    others = [b for b in backends if b.index != home]
    assert policy.select(others, RequestInfo(session_key="s")).index != home
    assert policy.select(backends, RequestInfo(session_key="s")).index == home


def test_sticky_places_a_new_session_on_the_least_loaded_and_keeps_it_there():
    policy = create_policy("session-affinity:home=sticky,max_sessions=2")
    first = policy.select(views(3, in_flight=[2, 0, 1]), RequestInfo(session_key="a"))
    assert (first.index, first.rule) == (1, "new-session")
    assert policy.select(views(3, in_flight=[0, 5, 0]), RequestInfo(session_key="a")).index == 1
    # Its backend gone, the session is pinned afresh on the least loaded.
    moved = policy.select([views(3, in_flight=[3, 0, 1])[i] for i in (0, 2)], RequestInfo(session_key="a"))
    assert (moved.index, moved.rule) == (2, "new-session")
    # Only two sessions are remembered: "a" is forgotten after "b" and "c".
    policy.select(views(3), RequestInfo(session_key="b"))
    policy.select(views(3), RequestInfo(session_key="c"))
    again = policy.select(views(3, in_flight=[0, 1, 1]), RequestInfo(session_key="a"))
    assert (again.index, again.rule) == (0, "new-session")


def test_an_integer_session_key_finds_the_home_of_its_decimal_string():
    # a trace's "session_id": 0 reached home_of as the int 0 and crashed on str.lstrip (issue 16)
    for home in ("modulo", "ring", "sticky"):
        policy = create_policy(f"session-affinity:home={home}")
        backends = views(4, in_flight=[3, 0, 1, 2])
        as_int = policy.select(backends, RequestInfo(session_key=6))
        as_str = policy.select(backends, RequestInfo(session_key="6"))
        assert as_int.index == as_str.index, home
    assert decide("session-affinity:home=modulo", views(4), session_key=0) == (0, "home")
