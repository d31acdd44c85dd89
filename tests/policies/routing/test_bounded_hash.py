from __future__ import annotations

from policies.routing import RequestInfo, create_policy
from policies.routing.hash_ring import RingCache
from tests.policies.routing.harness import views


def test_home_accepts_while_under_capacity_else_next_on_ring_takes_it():
    backends = views(4)
    walk = [b.index for b in RingCache().walk(backends, "s1")]
    policy = create_policy("bounded-hash")
    assert (policy.select(backends, RequestInfo(session_key="s1")).index, "home") == (walk[0], "home")
    # Total load 8 with the home at 4: capacity ceil(1.25 * 9 / 4) = 3, so the home is full
    # and so is the second on the ring; the third accepts.
    loads = [0] * 4
    loads[walk[0]], loads[walk[1]], loads[walk[2]] = 4, 3, 1
    d = policy.select(views(4, in_flight=loads), RequestInfo(session_key="s1"))
    assert (d.index, d.rule) == (walk[2], "overflow")


def test_no_backend_exceeds_the_bound_under_a_skewed_key_stream():
    policy = create_policy("bounded-hash:c=1.25")
    loads = [0] * 5
    for i in range(500):
        key = "hot" if i % 2 else f"k{i % 7}"  # half the stream is one key
        loads[policy.select(views(5, in_flight=loads), RequestInfo(session_key=key)).index] += 1
    assert max(loads) <= -(-1.25 * 500 // 5)


def test_prompt_prefix_is_the_key_without_a_session():
    policy = create_policy("bounded-hash:prefix_chars=8")
    backends = views(6)
    first = policy.select(backends, RequestInfo(prompt="You are a helpful assistant. Q1")).index
    assert policy.select(backends, RequestInfo(prompt="You are a pirate. Q2")).index == first
    assert policy.select(backends, RequestInfo()).rule == "no-key"
