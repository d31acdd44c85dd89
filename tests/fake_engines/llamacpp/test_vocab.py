"""Special tokens and llama-server's reading of prompt values."""

from __future__ import annotations

import pytest

from fake_engines.core import encode
from fake_engines.llamacpp.errors import LlamaError
from fake_engines.llamacpp.media import check_message_media, content_text
from fake_engines.llamacpp.vocab import BOS_ID, token_pieces, tokenize_content, tokenize_subprompt


def test_special_tokens_add_a_leading_bos_named_as_llama_server_names_it():
    assert tokenize_content("What is", add_special=True) == [BOS_ID, *encode("What is")]
    assert tokenize_content(["ab", 7, "cd"], add_special=True) == [BOS_ID, *encode("ab"), 7, *encode("cd")]
    assert tokenize_content([7, "cd"], add_special=True) == [7, *encode("cd")]  # BOS only before a leading string
    assert token_pieces([BOS_ID, *encode("What")]) == ["<s>", "What"]
    with pytest.raises(LlamaError, match="type must be string, but is number"):
        tokenize_content(3, add_special=False)
    assert tokenize_subprompt([5, 6], add_special=True) == [5, 6]  # ids are taken as given


def test_media_without_a_projector_is_refused_as_llama_server_refuses_it():
    assert content_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"
    for part, status in (({"type": "image_url"}, 500), ({"type": "input_video"}, 500), ({"type": "x"}, 400),
                         ({"text": "no type"}, 400)):
        with pytest.raises(LlamaError) as err:
            content_text([part])
        assert err.value.status == status
    with pytest.raises(LlamaError, match="image input is not supported"):
        check_message_media({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    check_message_media({"role": "user", "content": [{"text": "left to the chat checks"}]})
