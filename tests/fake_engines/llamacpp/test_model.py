"""-m: a real GGUF read with the gguf package, or a catalogue model and quantisation as a file name."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from fake_engines.llamacpp.model import ModelFileError, load_model


def test_real_gguf_metadata_gives_the_shape(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 2), (writer.add_context_length, 2048),
                       (writer.add_embedding_length, 64), (writer.add_head_count, 4), (writer.add_head_count_kv, 2),
                       (writer.add_key_length, 32), (writer.add_file_type, 0)):
        add(value)
    writer.add_token_list([f"t{i}" for i in range(512)])
    writer.add_tensor("token_embd.weight", np.zeros((512, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = load_model(str(path))
    assert (model.spec.layers, model.spec.kv_heads, model.spec.head_dim, model.spec.hidden) == (2, 2, 32, 64)
    assert (model.n_ctx_train, model.ftype, model.vocab_size) == (2048, "all F32", 512)
    assert (model.spec.params, model.size_bytes, model.bits_per_weight) == (32768, 131072, 32.0)


def test_catalogue_name_and_quantisation_need_no_file():
    model = load_model("models/llama-3.1-8b-Q4_K_M.gguf")
    assert model.spec.name == "llama-3.1-8b" and model.ftype == "MOSTLY_Q4_K_M"
    assert model.size_bytes == int(8.03e9 * 4.85 / 8)


@pytest.mark.parametrize("name", ["no-such-model-Q4_K_M.gguf", "llama-3.1-8b-Q9_Z.gguf", "llama-3.1-8b.bin"])
def test_unknown_names_are_refused(name):
    with pytest.raises(ModelFileError, match="failed to load model"):
        load_model(name)
