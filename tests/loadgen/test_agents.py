import pytest

from fake_engines.core import encode
from loadgen.agents import AgentSessions
from loadgen.prompts import PromptBuilder
from loadgen.synthetic import synthetic_requests


def test_example_16_shape_has_its_published_prompt_token_total():
    reqs = list(synthetic_requests("agents:sessions=6,turns=5,system=2000"))
    assert len(reqs) == 30
    # Example 16: computed 72800 + reused 95200 = 168000 prompt tokens under every policy
    assert sum(r.input_length for r in reqs) == 72800 + 95200 == 168000
    assert [r.input_length for r in reqs[:6]] == [4400, 2600, 2600, 2600, 4400, 2600]
    assert reqs[-1].input_length == 2000 + 600 * 5 and reqs[-1].session_id == "agent-5"


def test_each_turn_extends_the_previous_prompt_of_its_session_over_the_shared_system_prompt():
    builder = PromptBuilder()
    reqs = list(synthetic_requests("agents:sessions=3,turns=3,system=2000,growth=2400/600"))
    prompts = {}
    for i, req in enumerate(reqs):
        prompts.setdefault(req.session_id, []).append(builder.build(req, i))
    for turns in prompts.values():
        for earlier, later in zip(turns, turns[1:], strict=False):
            assert later.startswith(earlier) and len(later) > len(earlier)
    firsts = [encode(t[0]) for t in prompts.values()]
    assert firsts[0][:2000] == firsts[1][:2000] == firsts[2][:2000]
    assert firsts[0][2000:2100] != firsts[1][2000:2100]
    assert [len(encode(p)) for p in prompts["agent-1"]] == [2600, 3200, 3800]


def test_turns_arrive_think_time_apart_with_sessions_staggered():
    reqs = list(synthetic_requests("agents:sessions=2,turns=3,think=5,stagger=0.5"))
    assert [(r.timestamp_s, r.session_id) for r in reqs] == [
        (0.0, "agent-0"), (0.5, "agent-1"), (5.0, "agent-0"), (5.5, "agent-1"),
        (10.0, "agent-0"), (10.5, "agent-1")]


def test_block_size_is_the_gcd_of_system_and_growths():
    assert AgentSessions().block_tokens == 200
    assert AgentSessions(system_tokens=1000, growth_tokens=(300,)).block_tokens == 100


@pytest.mark.parametrize(("spec", "message"), [
    ("agents:sessions=0", "sessions must be >= 1"),
    ("agents:users=3", r"unknown agents option\(s\) \['users'\]"),
])
def test_bad_agent_specs_name_the_option(spec, message):
    with pytest.raises(ValueError, match=message):
        list(synthetic_requests(spec))
