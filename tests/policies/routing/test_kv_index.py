from __future__ import annotations

from flotilla.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from policies.routing.kv_index import KVIndex, block_keys, lora_root

BS = 4


def stored(hashes: list[int], tokens: list[int], parent: int | None = None, lora: str | None = None,
           medium: str | None = "GPU") -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BS,
                       lora_id=None, medium=medium, lora_name=lora)


def removed(hashes: list[int]) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium="GPU")


def batch(*events) -> KVEventBatch:
    # through the wire format, so the index reads exactly what a subscriber decodes
    return decode_batch(encode_batch(KVEventBatch(ts=0.0, events=list(events))))


PROMPT = list(range(100, 112))  # three blocks of 4


def test_stored_blocks_match_the_requests_prefix_in_tokens():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11, 12], PROMPT[:8])))
    assert index.prefix_tokens(PROMPT) == {"a": 8}
    assert index.prefix_tokens(PROMPT[:7]) == {"a": 4}  # only full blocks count
    assert index.block_size("a") == BS


def test_a_store_chained_on_a_parent_extends_the_prefix():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4]), stored([12, 13], PROMPT[4:12], parent=11)))
    assert index.prefix_tokens(PROMPT) == {"a": 12}
    assert index.engine_hashes("a") == {11, 12, 13}


def test_the_same_tokens_after_another_parent_are_another_prefix():
    index = KVIndex()
    index.apply_batch("a", batch(stored([21], [9, 9, 9, 9]), stored([22], PROMPT[4:8], parent=21)))
    assert index.prefix_tokens(PROMPT) == {"a": 0}


def test_a_removed_block_cuts_the_prefix_there():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11, 12, 13], PROMPT)))
    index.apply_batch("a", batch(removed([12])))
    assert index.prefix_tokens(PROMPT) == {"a": 4}
    assert index.engine_hashes("a") == {11, 13}
    assert index.stats("a").removed_blocks == 1


def test_removing_an_unknown_block_is_counted_and_harmless():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4]), removed([99])))
    assert index.prefix_tokens(PROMPT) == {"a": 4}
    assert index.stats("a").unknown_removals == 1


def test_all_blocks_cleared_empties_only_that_backend():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4])))
    index.apply_batch("b", batch(stored([11], PROMPT[:4])))
    index.apply_batch("a", batch(AllBlocksCleared()))
    assert index.prefix_tokens(PROMPT) == {"a": 0, "b": 4}
    assert index.size("a") == 0 and index.stats("a").clears == 1


def test_a_store_whose_parent_is_unknown_is_skipped_as_dynamo_does():
    index = KVIndex()
    index.apply_batch("a", batch(stored([12], PROMPT[4:8], parent=11)))
    assert index.size("a") == 0
    assert index.stats("a").orphan_stores == 1


def test_lora_blocks_match_only_requests_for_that_adapter():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11, 12], PROMPT[:8], lora="sql")))
    assert index.prefix_tokens(PROMPT, lora="sql") == {"a": 8}
    assert index.prefix_tokens(PROMPT) == {"a": 0}
    assert index.prefix_tokens(PROMPT, lora="other") == {"a": 0}


def test_cpu_offload_events_do_not_touch_the_gpu_index():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4]), stored([50], PROMPT[:4], medium="CPU"),
                                 BlockRemoved(block_hashes=[11], medium="CPU")))
    assert index.engine_hashes("a") == {11}
    assert index.stats("a").ignored_events == 2


def test_two_engine_hashes_for_the_same_tokens_keep_the_key_until_both_go():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4]), stored([31], PROMPT[:4])))
    index.apply_batch("a", batch(removed([11])))
    assert index.prefix_tokens(PROMPT) == {"a": 4}
    index.apply_batch("a", batch(removed([31])))
    assert index.prefix_tokens(PROMPT) == {"a": 0}


def test_restoring_a_held_hash_does_not_double_count():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11], PROMPT[:4]), stored([11], PROMPT[:4]), removed([11])))
    assert index.prefix_tokens(PROMPT) == {"a": 0} and index.size("a") == 0


def test_backends_with_other_block_sizes_are_matched_in_their_own_blocks():
    index = KVIndex()
    index.apply_batch("a", batch(stored([11, 12], PROMPT[:8])))
    big = BlockStored(block_hashes=[7], parent_block_hash=None, token_ids=PROMPT[:8], block_size=8,
                      lora_id=None, medium=None, lora_name=None)
    index.apply_batch("b", batch(big))
    assert index.prefix_tokens(PROMPT) == {"a": 8, "b": 8}


def test_a_declared_backend_without_events_is_tracked_and_matches_nothing():
    index = KVIndex()
    index.add_backend("a")
    assert index.tracks("a") and not index.tracks("b")
    assert index.prefix_tokens(PROMPT, backends=["a", "b"]) == {"a": 0}
    index.remove_backend("a")
    assert not index.tracks("a")


def test_block_keys_chain_so_one_key_names_the_whole_prefix():
    keys = block_keys(PROMPT, BS)
    assert len(keys) == 3
    assert block_keys(PROMPT[:8], BS) == keys[:2]
    assert block_keys(PROMPT[4:8], BS, parent=keys[0]) == [keys[1]]
    assert block_keys([0] + PROMPT[1:], BS)[1] != keys[1]
    assert block_keys(PROMPT, BS, lora="x")[0] != keys[0]
    assert lora_root("x") == lora_root("x") != lora_root(None)
