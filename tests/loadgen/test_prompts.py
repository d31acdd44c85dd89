from hypothesis import given, settings
from hypothesis import strategies as st

from fake_engines.core import encode
from loadgen.prompts import PromptBuilder, token_count
from loadgen.readers import mooncake
from loadgen.trace import TraceRequest
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"
BLOCK = 16


def _blocks(text: str, block_tokens: int) -> list[list[int]]:
    ids = encode(text)
    return [ids[i:i + block_tokens] for i in range(0, len(ids), block_tokens)]


def _request(ids: list[int], input_length: int) -> TraceRequest:
    return TraceRequest(timestamp_s=0.0, input_length=input_length, output_length=1,
                        hash_ids=tuple(ids), block_tokens=BLOCK)


ids_lists = st.lists(st.integers(0, 10_000), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(shared=st.lists(st.integers(0, 10_000), max_size=6), tail_a=ids_lists, tail_b=ids_lists,
       short_by=st.integers(0, 504))  # the last block keeps >= 8 tokens: random text cannot collide
def test_mooncake_prompts_sharing_k_leading_hash_ids_share_exactly_k_token_blocks(shared, tail_a, tail_b, short_by):
    if tail_a[0] == tail_b[0]:
        tail_b[0] += 10_001  # make the first id after the shared prefix differ
    ids_a, ids_b = shared + tail_a[:4], shared + tail_b[:4]
    rows = [{"timestamp": 0, "input_length": 512 * len(ids) - short_by, "output_length": 1, "hash_ids": ids}
            for ids in (ids_a, ids_b)]
    builder = PromptBuilder("prop")
    a, b = (_blocks(builder.build(mooncake.parse_record(row), i), 512) for i, row in enumerate(rows))
    k = len(shared)
    assert a[:k] == b[:k]
    assert a[k][:len(b[k])] != b[k][:len(a[k])]  # the first block after the shared prefix differs
    assert (len(a), len(b)) == (len(ids_a), len(ids_b))


@settings(max_examples=100, deadline=None)
@given(ids=ids_lists, short_by=st.integers(0, BLOCK - 1))
def test_prompt_has_exactly_input_length_tokens_even_with_a_partial_last_block(ids, short_by):
    length = BLOCK * len(ids) - short_by
    prompt = PromptBuilder().build(_request(ids, length), 0)
    assert len(encode(prompt)) == token_count(prompt) == length


def test_mooncake_prompts_share_the_first_512_token_block_of_the_conversation_trace():
    builder = PromptBuilder()
    reqs = list(mooncake.read(DATA / "mooncake_conversation.first60s.jsonl"))[:3]
    prompts = [builder.build(r, i) for i, r in enumerate(reqs)]
    assert [len(encode(p)) for p in prompts] == [6758, 7322, 7236]
    blocks = [_blocks(p, 512) for p in prompts]
    assert blocks[0][0] == blocks[1][0] == blocks[2][0]  # every request starts with hash id 0
    assert blocks[0][1] != blocks[1][1]


def test_a_request_without_hash_ids_gets_text_no_other_request_shares():
    builder = PromptBuilder()
    req = TraceRequest(timestamp_s=0.0, input_length=100, output_length=1)
    first, second = builder.build(req, 0), builder.build(req, 1)
    assert token_count(first) == 100 and encode(first)[:4] != encode(second)[:4]
    assert builder.build(req, 0) == first  # deterministic
