from fake_engines.core import ConfigError, OutputLengthSampler, decode, next_token_id, token_stream


def test_token_stream_depends_on_seed_and_request_id_only():
    def draw(seed: int, request_id: str) -> list[int]:
        stream = token_stream(seed, request_id)
        return [next_token_id(stream) for _ in range(20)]

    assert draw(3, "req-1") == draw(3, "req-1")
    assert draw(3, "req-1") != draw(3, "req-2")
    assert draw(3, "req-1") != draw(4, "req-1")


def test_generated_tokens_decode_to_readable_words():
    stream = token_stream(0, "r")
    text = decode([next_token_id(stream) for _ in range(30)])
    words = text.split(" ")
    assert len(text) == 120 and words[-1] == ""
    assert all(len(w) == 3 and w.isalpha() and w.islower() for w in words[:-1])


def test_output_lengths_are_seeded_capped_and_average_the_mean():
    a = OutputLengthSampler(seed=7, mean_output_tokens=128)
    b = OutputLengthSampler(seed=7, mean_output_tokens=128)
    draws = [a.sample(max_tokens=100_000) for _ in range(4000)]
    assert draws == [b.sample(max_tokens=100_000) for _ in range(4000)]
    assert min(draws) >= 1 and 115 < sum(draws) / len(draws) < 141
    assert max(a.sample(max_tokens=16) for _ in range(200)) == 16


def test_ignore_eos_generates_exactly_max_tokens():
    assert OutputLengthSampler(seed=1).sample(max_tokens=77, ignore_eos=True) == 77


def test_mean_below_one_token_is_rejected_naming_the_field():
    try:
        OutputLengthSampler(mean_output_tokens=0.5)
    except ConfigError as err:
        assert err.field == "mean_output_tokens"
    else:
        raise AssertionError("expected ConfigError")


def test_drawing_many_tokens_at_once_matches_drawing_them_one_by_one() -> None:
    import random

    from fake_engines.core._generator import next_token_ids

    for seed in range(50):
        bulk, single = random.Random(seed), random.Random(seed)
        count = seed * 7
        assert next_token_ids(bulk, count) == [next_token_id(single) for _ in range(count)]
        assert bulk.random() == single.random()  # both streams left in the same state
