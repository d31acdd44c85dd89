from __future__ import annotations

import pytest

from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.memory import PRECISIONS_BITS, fit, gpus_needed, kv_cache_bytes
from fake_engines.perf.rounding import fixed

# Example 1 of the seed lesson: model, bits, weights GB, KV GB, total GB, GPUs, read ms 1 GPU, read ms split
EXAMPLE_1 = [
    ("llama-3.1-8b", "8B", [("16.0", "16.1", "34.4", "50.4", 1, "4.8", "4.8"),
                            ("8.0", "8.0", "34.4", "42.4", 1, "2.4", "2.4"),
                            ("4.5", "4.5", "34.4", "38.9", 1, "1.3", "1.3")]),
    ("llama-3.1-70b", "70B", [("16.0", "141.2", "85.9", "227.1", 4, "42.1", "10.5"),
                              ("8.0", "70.6", "85.9", "156.5", 3, "21.1", "7.0"),
                              ("4.5", "39.7", "85.9", "125.6", 2, "11.9", "5.9")]),
    ("llama-3.1-405b", "405B", [("16.0", "810.0", "135.3", "945.3", 14, "241.8", "17.3"),
                                ("8.0", "405.0", "135.3", "540.3", 8, "120.9", "15.1"),
                                ("4.5", "227.8", "135.3", "363.1", 6, "68.0", "11.3")]),
]


@pytest.mark.parametrize(("name", "label", "rows"), EXAMPLE_1, ids=[r[1] for r in EXAMPLE_1])
def test_example_1_every_printed_figure(name, label, rows):
    model = load_catalogue().model(name)
    for bits, expected in zip(PRECISIONS_BITS, rows, strict=True):
        r = fit(model, bits, users=32, context_tokens=8192, usable_bytes_per_gpu=80e9 * 0.9,
                bandwidth_bytes_s=3.35e12)
        got = (fixed(bits, 1), fixed(r.weights_bytes / 1e9, 1), fixed(r.kv_bytes / 1e9, 1),
               fixed(r.total_bytes / 1e9, 1), r.gpus, fixed(r.read_1gpu_s * 1e3, 1),
               fixed(r.read_split_s * 1e3, 1))
        assert got == expected


def test_example_1_kv_cache_per_token_in_kib():
    cat = load_catalogue()
    lines = [f"KV cache per token, {label}: {cat.model(name).kv_bytes_per_token() / 1024:.0f} KiB"
             for name, label, _ in EXAMPLE_1]
    assert lines == ["KV cache per token, 8B: 128 KiB", "KV cache per token, 70B: 320 KiB",
                     "KV cache per token, 405B: 504 KiB"]


def test_kv_cache_grows_with_users_and_context():
    m = load_catalogue().model("llama-3.1-8b")
    assert kv_cache_bytes(m, 2, 100) == 2 * kv_cache_bytes(m, 1, 100) == kv_cache_bytes(m, 1, 200)


def test_gpus_needed_rounds_up_and_rejects_no_usable_memory():
    assert gpus_needed(72e9, 72e9) == 1
    assert gpus_needed(72e9 + 1, 72e9) == 2
    with pytest.raises(ValueError, match="usable_bytes_per_gpu"):
        gpus_needed(1.0, 0.0)
