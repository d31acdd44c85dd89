"""llama.cpp's built-in chat templates: what `--no-jinja` renders with (src/llama-chat.cpp, build 0c1e570).

llama_chat_apply_template takes a template *source* and recognises it either by name (`chatml`,
`llama3`, ...) or by the markers in its text (llm_chat_detect_template), then formats the messages
in C++ without a Jinja engine. The look-alike renders the common ones; a name or source it does not
render is refused at start as llama-server refuses one it does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Chat = Sequence[tuple[str, str]]
"""(role, content) pairs, content already flattened to text."""

NAMES = ("bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml", "command-r", "deepseek",
         "deepseek-ocr", "deepseek2", "deepseek3", "exaone-moe", "exaone3", "exaone4", "falcon3", "gemma", "gigachat",
         "glmedge", "gpt-oss", "granite", "granite-4.0", "granite-4.1", "grok-2", "hunyuan-dense", "hunyuan-moe",
         "hunyuan-vl", "kimi-k2", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3", "llama4",
         "megrez", "minicpm", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken",
         "monarch", "openchat", "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world", "seed_oss", "smolvlm",
         "solar-open", "vicuna", "vicuna-orca", "yandex", "zephyr")
"""Every name llama_chat_builtin_templates lists (LLM_CHAT_TEMPLATES, sorted as its std::map)."""


def _strip(text: str) -> str:
    return text.strip(" \t\n\r\v\f")  # llama-chat.cpp's trim(): isspace


def detect(source: str) -> str | None:
    """llm_chat_detect_template: a built-in name, else the first family whose markers `source` holds
    (in llama.cpp's order, for the families rendered here); None when none matches."""
    if source in NAMES:
        return source
    has = source.__contains__
    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "smolvlm" if has("<end_of_utterance>") else "chatml"
    if source.startswith("mistral") or has("[INST]"):
        return _mistral_or_llama2(source)
    for name, markers in _MARKERS:
        if all(has(m) for m in markers):
            return name
    return None


_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("phi3", ("<|assistant|>", "<|end|>")),
    ("chatglm4", ("[gMASK]<sop>",)),
    ("exaone-moe", ("<|assistant|>", "<|user|>", "<|tool_declare|>")),
    ("falcon3", ("<|assistant|>", "<|user|>", "</s>")),
    ("glmedge", ("<|assistant|>", "<|user|>")),
    ("zephyr", ("<|user|>", "<|endoftext|>")),
    ("monarch", ("bos_token + message['role']",)),
    ("gemma", ("<start_of_turn>",)),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",)),
    ("openchat", ("GPT4 Correct ",)),
    ("vicuna-orca", ("USER: ", "ASSISTANT: ", "SYSTEM: ")),
    ("vicuna", ("USER: ", "ASSISTANT: ")),
    ("deepseek", ("### Instruction:", "<|EOT|>")),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>")),
    ("chatglm3", ("[gMASK]sop",)),
    ("minicpm", ("<用户>",)),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",)),
    ("deepseek3", ("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>")),
    ("exaone4", ("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]")),
    ("exaone3", ("[|system|]", "[|assistant|]", "[|endofturn|]")),
    ("rwkv-world", ("rwkv-world",)),
    ("rwkv-world", ("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",)),
    ("granite-4.0", ("<|start_of_role|>", "<tool_call>", "g4_default_system_message")),
    ("granite-4.0", ("<|start_of_role|>", "<tools>", "g4_default_system_message")),
    ("granite-4.1", ("<|start_of_role|>", "<tool_call>")),
    ("granite-4.1", ("<|start_of_role|>", "<tools>")),
    ("granite", ("<|start_of_role|>",)),
    ("megrez", ("<|role_start|>",)),
)
"""llm_chat_detect_template's marker tests after chatml and [INST], in its order, up to deepseek3
(the families after megrez are recognised by name only here)."""


def _mistral_or_llama2(source: str) -> str:
    if "[SYSTEM_PROMPT]" in source:
        return "mistral-v7"
    if "' [INST] ' + system_message" in source or "[AVAILABLE_TOOLS]" in source:
        return "mistral-v1" if " [INST]" in source else "mistral-v3-tekken" if '"[INST]"' in source else "mistral-v3"
    if "content.strip()" in source:
        return "llama2-sys-strip"
    if "bos_token + '[INST]" in source:
        return "llama2-sys-bos"
    return "llama2-sys" if "<<SYS>>" in source else "llama2"


def apply(name: str, chat: Chat, add_ass: bool) -> str | None:
    """llm_chat_apply_template for a detected name; None for a family the look-alike does not render."""
    render = _RENDERERS.get(name)
    return None if render is None else render(chat, add_ass)


def _chatml(chat: Chat, add_ass: bool) -> str:
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in chat) + ("<|im_start|>assistant\n" if add_ass else "")


def _phi4(chat: Chat, add_ass: bool) -> str:
    return "".join(f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>" for r, c in chat) + \
        ("<|im_start|>assistant<|im_sep|>" if add_ass else "")


def _mistral_v7(tekken: bool) -> Callable[[Chat, bool], str]:
    space = "" if tekken else " "

    def render(chat: Chat, add_ass: bool) -> str:
        out = []
        for role, content in chat:
            if role == "system":
                out.append(f"[SYSTEM_PROMPT]{space}{content}[/SYSTEM_PROMPT]")
            elif role == "user":
                out.append(f"[INST]{space}{content}[/INST]")
            else:
                out.append(f"{space}{content}</s>")
        return "".join(out)
    return render


def _mistral_v1_v3(name: str) -> Callable[[Chat, bool], str]:
    leading = " " if name == "mistral-v1" else ""
    trailing = "" if name == "mistral-v3-tekken" else " "

    def render(chat: Chat, add_ass: bool) -> str:
        out, inside = [], False
        for role, content in chat:
            if not inside:
                out.append(f"{leading}[INST]{trailing}")
                inside = True
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(f"{content}{leading}[/INST]")
            else:
                out.append(f"{trailing}{_strip(content) if name == 'mistral-v3' else content}</s>")
                inside = False
        return "".join(out)
    return render


def _llama2(name: str) -> Callable[[Chat, bool], str]:
    def render(chat: Chat, add_ass: bool) -> str:
        out, inside = ["[INST] "], True
        for role, raw in chat:
            content = _strip(raw) if name == "llama2-sys-strip" else raw
            if not inside:
                inside = True
                out.append("<s>[INST] " if name == "llama2-sys-bos" else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if name != "llama2" else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return render


def _tagged(fmt: str, generation: str) -> Callable[[Chat, bool], str]:
    """Families that write every message as `fmt` with role and content, then a generation prompt."""
    def render(chat: Chat, add_ass: bool) -> str:
        return "".join(fmt.format(role=r, content=c) for r, c in chat) + (generation if add_ass else "")
    return render


def _gemma(chat: Chat, add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += _strip(content)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_strip(content) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_ass else "")


def _monarch(chat: Chat, add_ass: bool) -> str:
    out = "".join(("" if i == 0 else "<s>") + f"{r}\n{c}</s>\n" for i, (r, c) in enumerate(chat))
    return out + ("<s>assistant\n" if add_ass else "")


def _openchat(chat: Chat, add_ass: bool) -> str:
    out = [c + "<|end_of_turn|>" if r == "system" else f"GPT4 Correct {r[:1].upper()}{r[1:]}: {c}<|end_of_turn|>"
           for r, c in chat]
    return "".join(out) + ("GPT4 Correct Assistant:" if add_ass else "")


def _by_role(parts: dict[str, str], generation: str, strip: bool = False) -> Callable[[Chat, bool], str]:
    """Families that format system, user and assistant messages each their own way (others dropped)."""
    def render(chat: Chat, add_ass: bool) -> str:
        out = [parts[r].format(content=_strip(c) if strip else c) for r, c in chat if r in parts]
        return "".join(out) + (generation if add_ass else "")
    return render


def _orion(chat: Chat, add_ass: bool) -> str:
    out, system = [], ""
    for role, content in chat:
        if role == "system":
            system += content
        elif role == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + content + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(content + "</s>")
    return "".join(out)


def _rwkv_world(chat: Chat, add_ass: bool) -> str:
    out = []
    for i, (role, content) in enumerate(chat):
        if role == "system":
            out.append(f"System: {_strip(content)}\n\n")
        elif role == "user":
            out.append(f"User: {_strip(content)}\n\n" + ("Assistant:" if i == len(chat) - 1 else ""))
        elif role == "assistant":
            out.append(f"Assistant: {_strip(content)}\n\n")
    return "".join(out)


def _granite(v4: bool) -> Callable[[Chat, bool], str]:
    def render(chat: Chat, add_ass: bool) -> str:
        out = []
        for role, content in chat:
            if role == "assistant_tool_call":
                head = "<|start_of_role|>assistant<|end_of_role|><|tool_call|>" if v4 else \
                    "<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>"
            else:
                head = f"<|start_of_role|>{role}<|end_of_role|>"
            out.append(f"{head}{content}<|end_of_text|>\n")
        return "".join(out) + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")
    return render


_RENDERERS: dict[str, Callable[[Chat, bool], str]] = {
    "chatml": _chatml, "phi4": _phi4,
    "mistral-v7": _mistral_v7(False), "mistral-v7-tekken": _mistral_v7(True),
    **{n: _mistral_v1_v3(n) for n in ("mistral-v1", "mistral-v3", "mistral-v3-tekken")},
    **{n: _llama2(n) for n in ("llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip")},
    "phi3": _tagged("<|{role}|>\n{content}<|end|>\n", "<|assistant|>\n"),
    "falcon3": _tagged("<|{role}|>\n{content}\n", "<|assistant|>\n"),
    "zephyr": _tagged("<|{role}|>\n{content}<|endoftext|>\n", "<|assistant|>\n"),
    "chatglm4": lambda chat, add: "[gMASK]<sop>" + _tagged("<|{role}|>\n{content}", "<|assistant|>\n")(chat, add),
    "monarch": _monarch, "gemma": _gemma, "openchat": _openchat,
    "vicuna": _by_role({"system": "{content}\n\n", "user": "USER: {content}\n", "assistant": "ASSISTANT: {content}</s>\n"},
                       "ASSISTANT:"),
    "vicuna-orca": _by_role({"system": "SYSTEM: {content}\n", "user": "USER: {content}\n",
                             "assistant": "ASSISTANT: {content}</s>\n"}, "ASSISTANT:"),
    "deepseek": _by_role({"system": "{content}", "user": "### Instruction:\n{content}\n",
                          "assistant": "### Response:\n{content}\n<|EOT|>\n"}, "### Response:\n"),
    "command-r": _by_role({r: "<|START_OF_TURN_TOKEN|><|" + t + "_TOKEN|>{content}<|END_OF_TURN_TOKEN|>"
                           for r, t in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))},
                          "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", strip=True),
    "llama3": lambda chat, add: "".join(f"<|start_header_id|>{r}<|end_header_id|>\n\n{_strip(c)}<|eot_id|>"
                                        for r, c in chat) + ("<|start_header_id|>assistant<|end_header_id|>\n\n"
                                                             if add else ""),
    "deepseek2": _by_role({"system": "{content}\n\n", "user": "User: {content}\n\n",
                           "assistant": "Assistant: {content}<｜end▁of▁sentence｜>"}, "Assistant:"),
    "orion": _orion,
    "chatglm3": lambda chat, add: "[gMASK]sop" + _tagged("<|{role}|>\n {content}", "<|assistant|>")(chat, add),
    "glmedge": _tagged("<|{role}|>\n{content}", "<|assistant|>"),
    "minicpm": lambda chat, add: "".join(f"<用户>{_strip(c)}<AI>" if r == "user" else _strip(c) for r, c in chat),
    "deepseek-ocr": lambda chat, add: "".join(c for _, c in chat),
    "exaone3": _by_role({"system": "[|system|]{content}[|endofturn|]\n", "user": "[|user|]{content}\n",
                         "assistant": "[|assistant|]{content}[|endofturn|]\n"}, "[|assistant|]", strip=True),
    "exaone4": _by_role({"system": "[|system|]{content}[|endofturn|]\n", "user": "[|user|]{content}\n",
                         "assistant": "[|assistant|]{content}[|endofturn|]\n", "tool": "[|tool|]{content}[|endofturn|]\n"},
                        "[|assistant|]", strip=True),
    "exaone-moe": _by_role({r: f"<|{r}|>\n{{content}}<|endofturn|>\n" for r in ("system", "user", "assistant", "tool")},
                           "<|assistant|>\n", strip=True),
    "rwkv-world": _rwkv_world,
    "granite": _granite(False), "granite-4.0": _granite(True), "granite-4.1": _granite(True),
    "megrez": _tagged("<|role_start|>{role}<|role_end|>{content}<|turn_end|>", "<|role_start|>assistant<|role_end|>"),
    "solar-open": _tagged("<|begin|>{role}<|content|>{content}<|end|>", "<|begin|>assistant"),
    "deepseek3": _by_role({"system": "{content}\n\n", "user": "<｜User｜>{content}",
                           "assistant": "<｜Assistant｜>{content}<｜end▁of▁sentence｜>"}, "<｜Assistant｜>"),
}
