"""Make the interop suite's models locally: random weights, no model hub.

Runs in the vLLM venv (torch, transformers, tokenizers, peft). Writes into OUT:

- `tiny/`: a Hugging Face Llama (safetensors) with a byte-level BPE tokenizer trained here on
  generated text, a ChatML chat template and a generation config; what vLLM serves.
- `tiny.gguf`: the same model converted with llama.cpp's own converter (f32); what
  llama-server serves.
- `loras/lora-a`, `loras/lora-b`: two peft LoRA adapters (r=8, q/k/v/o, non-zero weights).
- `slow.gguf`: a 70M-parameter random Llama with the same tokenizer (f16), for llama-server tests
  that need a visible load phase (its 503 "Loading model") or a decode step long enough to
  disconnect in the middle of.

Derived from the capture scripts made for this project (make_tiny.py, convert_tiny.py,
make_lora.py of the real-engine captures, 2026-12-01); licence Apache-2.0, as the project.

usage: python make_models.py OUT CONVERTER_DIR
CONVERTER_DIR holds llama.cpp's convert_hf_to_gguf.py, gguf-py/ and conversion/.
"""

from __future__ import annotations

import json
import os
import random
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

SPECIAL = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ("the a an of to in is was for on that with as by at from this be are it or have not but "
         "hello world model token cache server request stream llama vllm metric health count time "
         "quick brown fox jumps over lazy dog one two three four five six seven eight nine ten "
         "red green blue yellow cat house tree river mountain city road car train plane ship "
         "user assistant system say tell write story about answer question please thanks").split()
# Shapes: vLLM's CPU attention takes head sizes 32, 64, ... only, so head_dim is set explicitly.
# Contexts of 8192 let a test stream thousands of tokens, long enough to disconnect mid-way.
MAX_POSITIONS = 8192
SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32)
SLOW_SHAPE = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=12,
                  num_key_value_heads=4, head_dim=64)


def sentence(rng: random.Random) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16)))
    return words.capitalize() + rng.choice([".", "!", "?", ",", ":"]) + rng.choice(["", " 123", " 42.", " (x)"])


def make_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([sentence(rng) for _ in range(20000)], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 pad_token="</s>", additional_special_tokens=SPECIAL[3:],
                                 model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(chat_template=CHAT_TEMPLATE, add_bos_token=True, add_prefix_space=False)
    config_path.write_text(json.dumps(config, indent=2))
    return hf


def make_model(out: Path, shape: dict, tokenizer_from: Path | None = None) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    if tokenizer_from is None:
        hf = make_tokenizer(out)
    else:
        hf = AutoTokenizer.from_pretrained(tokenizer_from)
        hf.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(hf), max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=hf.bos_token_id,
                         eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id, **shape)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=hf.bos_token_id,
                     eos_token_id=[hf.eos_token_id, hf.convert_tokens_to_ids("<|im_end|>")]).save_pretrained(out)


def make_loras(base: Path, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    for name, seed in (("lora-a", 1), ("lora-b", 2)):
        torch.manual_seed(seed)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                            lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", init_lora_weights=False)
        model = get_peft_model(LlamaForCausalLM.from_pretrained(base, dtype=torch.float32), config)
        model.save_pretrained(out / name, safe_serialization=True)


def convert_gguf(model: Path, outfile: Path, converter: Path, outtype: str = "f32") -> None:
    """llama.cpp's converter, in a process of its own (it is a script with global state)."""
    subprocess.run([sys.executable, __file__, "--convert", str(model), str(outfile), str(converter), outtype],
                   check=True)


def run_converter(model: Path, outfile: Path, converter: Path, outtype: str) -> None:
    """Told that this freshly trained byte-level BPE pre-tokenizes as GPT-2 (it does: same regex);
    its hash is in no registry, so the converter would refuse it otherwise."""
    sys.path[:0] = [str(converter), str(converter / "gguf-py")]
    import conversion.base as base  # noqa: PLC0415  (exists only in the converter's folder)

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = [str(converter / "convert_hf_to_gguf.py"), str(model), "--outfile", str(outfile), "--outtype", outtype]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    if sys.argv[1] == "--convert":
        run_converter(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
        return
    out, converter = Path(sys.argv[1]), Path(sys.argv[2])
    tiny = out / "tiny"
    tiny.mkdir(parents=True, exist_ok=True)
    make_model(tiny, SHAPE)
    make_loras(tiny, out / "loras")
    convert_gguf(tiny, out / "tiny.gguf", converter)
    slow = out / "slow"
    make_model(slow, SLOW_SHAPE, tokenizer_from=tiny)
    convert_gguf(slow, out / "slow.gguf", converter, outtype="f16")
    shutil.rmtree(slow)  # only the GGUF is served
    (out / ".complete").write_text(json.dumps({"shape": SHAPE, "max_positions": MAX_POSITIONS}) + "\n")
    print(f"models in {out}: {sorted(os.listdir(out))}")


if __name__ == "__main__":
    main()
