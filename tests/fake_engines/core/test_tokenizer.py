from hypothesis import given
from hypothesis import strategies as st

from fake_engines.core import CHARS_PER_TOKEN, VOCAB_SIZE, decode, encode


def test_ascii_text_takes_one_token_per_four_characters():
    assert CHARS_PER_TOKEN == 4
    assert len(encode("x" * 400)) == 100
    assert len(encode("hello")) == 2
    assert encode("") == []


def test_ids_are_fixed_across_calls_and_distinct_per_chunk():
    assert encode("abcd") == encode("abcd")
    assert encode("abcd") != encode("abce")
    # Ids count chunks by length, then in base 98 over tab, newline, carriage return and ' '..'~'.
    assert encode("\t") == [0] and encode("a") == [68]
    assert encode("ab") == [98 + 68 * 98 + 69]


def test_non_ascii_chunk_splits_into_one_token_per_character():
    ids = encode("ab\u00e9c")
    assert len(ids) == 4
    assert decode(ids) == "ab\u00e9c"


@given(st.text())
def test_decode_inverts_encode(text):
    ids = encode(text)
    assert decode(ids) == text
    assert all(0 <= i < VOCAB_SIZE for i in ids)


@given(st.text(), st.text())
def test_encoding_is_prefix_stable_at_chunk_boundaries(a, b):
    head = a[: len(a) - len(a) % CHARS_PER_TOKEN]
    assert encode(head + b)[: len(encode(head))] == encode(head)


def test_out_of_range_id_is_a_value_error():
    try:
        decode([VOCAB_SIZE])
    except ValueError as err:
        assert "outside" in str(err)
    else:
        raise AssertionError("expected ValueError")


@given(st.text(alphabet=st.characters(max_codepoint=200), min_size=60, max_size=300))
def test_long_texts_encode_as_chunk_by_chunk(text: str) -> None:
    from fake_engines.core._tokenizer import _encode_chunks

    assert encode(text) == _encode_chunks(text)
    assert decode(encode(text)) == text
