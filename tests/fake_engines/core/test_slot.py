from fake_engines.core import EngineRequest
from fake_engines.core._slot import Slot, common_prefix_len, select_slot


def test_common_prefix_len_stops_at_the_first_difference():
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0


def test_similar_idle_slot_wins_over_the_least_recently_used():
    slots = [Slot(0, 512, cache_tokens=[9] * 10, t_last_used=1), Slot(1, 512, cache_tokens=[1] * 5, t_last_used=5)]
    assert select_slot(slots, [1] * 20, similarity=0.10).id == 1  # 5/20 = 0.25 > 0.10
    assert select_slot(slots, [1] * 60, similarity=0.10).id == 0  # 5/60 < 0.10: LRU


def test_similarity_zero_takes_the_least_recently_used_highest_id_on_ties():
    # The llama-server capture: a fresh server with -np 2 logs "id  1 | selected slot by LRU, t_last = -1".
    slots = [Slot(i, 512, cache_tokens=[1] * 5) for i in range(3)]
    assert select_slot(slots, [1] * 5, similarity=0.0).id == 2
    slots[2].t_last_used = 4
    assert select_slot(slots, [1] * 5, similarity=0.0).id == 1


def test_busy_slots_are_never_chosen():
    busy = Slot(0, 512, request=EngineRequest("x", [1], max_tokens=1, output_len=1), cache_tokens=[1] * 9)
    assert select_slot([busy], [1] * 9, similarity=0.1) is None
    assert select_slot([busy, Slot(1, 512)], [1] * 9, similarity=0.1).id == 1


def test_idle_slot_state_shows_the_last_prompt_and_no_progress():
    state = Slot(0, 1024, id_task=3, last_request_id="r", last_n_prompt_tokens=427).state()
    assert (state.is_processing, state.n_prompt_tokens, state.n_prompt_tokens_processed, state.n_remain) == (
        False, 427, 0, -1)
