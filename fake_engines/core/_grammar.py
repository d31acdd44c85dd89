"""GBNF grammars as llama.cpp parses them (src/llama-grammar.cpp), and a seeded string each accepts.

The parser follows llama.cpp's: rules `name ::= alternates` one per line (newlines only inside
parentheses), names of letters, digits and `-`, `#` comments, literals with llama.cpp's escapes,
character classes (`[^...]`, ranges), `.`, groups and the `* + ? {m} {m,} {m,n}` repetitions
(at most 2000). After parsing every referenced rule must exist, `root` must exist and no rule may be
left-recursive, as llama.cpp checks before it builds the sampler; any failure is a GrammarError
(llama-server answers 400 "Failed to initialize samplers: failed to parse grammar").

`generate` walks the grammar with a seeded random source: alternatives and repetition counts
are drawn while the text is short, and the shortest completion is taken once it is long, so the
string is finite, deterministic per seed, and accepted by the grammar.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MAX_REPETITION_THRESHOLD = 2000
"""llama.cpp's bound on `{m,n}` counts."""


class GrammarError(ValueError):
    """The grammar does not parse, or fails llama.cpp's checks (the message is llama.cpp's log line)."""


@dataclass(frozen=True)
class Lit:
    """A literal string."""

    text: str


@dataclass(frozen=True)
class CharClass:
    """`[...]`, `[^...]` or `.` (negated, no ranges)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool


@dataclass(frozen=True)
class Ref:
    """A rule reference."""

    name: str


@dataclass(frozen=True)
class Alt:
    """Alternatives, each a sequence."""

    options: tuple[tuple[object, ...], ...]


@dataclass(frozen=True)
class Rep:
    """`item{min,max}`; max None for unbounded."""

    item: object
    min: int
    max: int | None


def _is_word_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.rules: dict[str, Alt] = {}
        self.refs: list[str] = []

    def at(self, pos: int, k: int = 0) -> str:
        return self.src[pos + k] if pos + k < len(self.src) else ""

    def space(self, pos: int, newline_ok: bool) -> int:
        while pos < len(self.src):
            c = self.src[pos]
            if c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            elif c == "#":
                while pos < len(self.src) and self.src[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < len(self.src) and _is_word_char(self.src[end]):
            end += 1
        if end == pos:
            raise GrammarError(f"expecting name at {self.src[pos:]}")
        return end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < len(self.src) and self.src[end].isdigit():
            end += 1
        if end == pos:
            raise GrammarError(f"expecting integer at {self.src[pos:]}")
        return int(self.src[pos:end]), end

    def char(self, pos: int) -> tuple[int, int]:
        if self.at(pos) == "\\":
            esc = self.at(pos, 1)
            sizes = {"x": 2, "u": 4, "U": 8}
            if esc in sizes:
                digits = self.src[pos + 2:pos + 2 + sizes[esc]]
                if len(digits) < sizes[esc] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise GrammarError(f"expecting {sizes[esc]} hex chars at {self.src[pos:]}")
                return int(digits, 16), pos + 2 + sizes[esc]
            simple = {'"': '"', "[": "[", "]": "]", "\\": "\\", "t": "\t", "r": "\r", "n": "\n"}
            if esc in simple:
                return ord(simple[esc]), pos + 2
            if esc:
                raise GrammarError(f"unknown escape at {self.src[pos:]}")
            raise GrammarError("unexpected end of input")
        if pos >= len(self.src):
            raise GrammarError("unexpected end of input")
        return ord(self.src[pos]), pos + 1

    def sequence(self, pos: int, nested: bool) -> tuple[tuple[object, ...], int]:
        items: list[object] = []
        while pos < len(self.src):
            c = self.src[pos]
            if c == '"':
                pos += 1
                chars = []
                while self.at(pos) != '"':
                    if not self.at(pos):
                        raise GrammarError("unexpected end of input")
                    code, pos = self.char(pos)
                    chars.append(chr(code))
                items.append(Lit("".join(chars)))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                negated = self.at(pos) == "^"
                pos += negated
                ranges = []
                while self.at(pos) != "]":
                    if not self.at(pos):
                        raise GrammarError("unexpected end of input")
                    lo, pos = self.char(pos)
                    hi = lo
                    if self.at(pos) == "-" and self.at(pos, 1) != "]":
                        if not self.at(pos, 1):
                            raise GrammarError("unexpected end of input")
                        hi, pos = self.char(pos + 1)
                    ranges.append((lo, hi))
                items.append(CharClass(tuple(ranges), negated))
                pos = self.space(pos + 1, nested)
            elif _is_word_char(c):
                end = self.name(pos)
                self.refs.append(self.src[pos:end])
                items.append(Ref(self.src[pos:end]))
                pos = self.space(end, nested)
            elif c == "(":
                alt, pos = self.alternates(self.space(pos + 1, True), True)
                if self.at(pos) != ")":
                    raise GrammarError(f"expecting ')' at {self.src[pos:]}")
                items.append(alt)
                pos = self.space(pos + 1, nested)
            elif c == ".":
                items.append(CharClass((), True))
                pos = self.space(pos + 1, nested)
            elif c in "*+?{":
                if not items:
                    raise GrammarError(f"expecting preceding item to */+/?/{{ at {self.src[pos:]}")
                bounds, pos = self.repetition(pos, nested)
                items[-1] = Rep(items[-1], *bounds)
            else:
                break
        return tuple(items), pos

    def repetition(self, pos: int, nested: bool) -> tuple[tuple[int, int | None], int]:
        c = self.src[pos]
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c], self.space(pos + 1, nested)
        pos = self.space(pos + 1, nested)
        low, pos = self.integer(pos)
        pos = self.space(pos, nested)
        high: int | None = low
        if self.at(pos) == ",":
            pos = self.space(pos + 1, nested)
            if self.at(pos).isdigit():
                high, pos = self.integer(pos)
                pos = self.space(pos, nested)
            else:
                high = None
        if self.at(pos) != "}":
            raise GrammarError(f"expecting '}}' at {self.src[pos:]}")
        if low > MAX_REPETITION_THRESHOLD or (high is not None and high > MAX_REPETITION_THRESHOLD):
            raise GrammarError("number of repetitions exceeds sane defaults, please reduce the number of repetitions")
        return (low, high), self.space(pos + 1, nested)

    def alternates(self, pos: int, nested: bool) -> tuple[Alt, int]:
        seq, pos = self.sequence(pos, nested)
        options = [seq]
        while self.at(pos) == "|":
            seq, pos = self.sequence(self.space(pos + 1, True), nested)
            options.append(seq)
        return Alt(tuple(options)), pos

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.src[pos:end]
        pos = self.space(end, False)
        if self.src[pos:pos + 3] != "::=":
            raise GrammarError(f"expecting ::= at {self.src[pos:]}")
        alt, pos = self.alternates(self.space(pos + 3, True), False)
        self.rules[name] = alt
        if self.at(pos) == "\r":
            pos += 2 if self.at(pos, 1) == "\n" else 1
        elif self.at(pos) == "\n":
            pos += 1
        elif self.at(pos):
            raise GrammarError(f"expecting newline or end at {self.src[pos:]}")
        return self.space(pos, True)


@dataclass(frozen=True)
class Grammar:
    """A parsed, checked grammar."""

    rules: dict[str, Alt]


def parse_grammar(src: str) -> Grammar:
    """Parse and check `src` as llama.cpp does; GrammarError when it would refuse it."""
    parser = _Parser(src)
    pos = parser.space(0, True)
    while pos < len(src):
        pos = parser.rule(pos)
    for name in parser.refs:
        if name not in parser.rules:
            raise GrammarError(f"Undefined rule identifier '{name}'")
    if "root" not in parser.rules:
        raise GrammarError("grammar does not contain a 'root' symbol")
    grammar = Grammar(parser.rules)
    _check_left_recursion(grammar)
    return grammar


def _nullable(grammar: Grammar) -> set[str]:
    """Rules that can match the empty string (a fixed point)."""
    nullable: set[str] = set()

    def can_be_empty(item: object) -> bool:
        if isinstance(item, Lit):
            return not item.text
        if isinstance(item, CharClass):
            return False
        if isinstance(item, Ref):
            return item.name in nullable
        if isinstance(item, Rep):
            return item.min == 0 or can_be_empty(item.item)
        assert isinstance(item, Alt)
        return any(all(can_be_empty(i) for i in seq) for seq in item.options)

    changed = True
    while changed:
        changed = False
        for name, alt in grammar.rules.items():
            if name not in nullable and can_be_empty(alt):
                nullable.add(name)
                changed = True
    return nullable


def _check_left_recursion(grammar: Grammar) -> None:
    nullable = _nullable(grammar)

    def leftmost(item: object, out: set[str]) -> bool:
        """Add the rules `item` can start with to `out`; True if it can also be empty."""
        if isinstance(item, Lit):
            return not item.text
        if isinstance(item, CharClass):
            return False
        if isinstance(item, Ref):
            out.add(item.name)
            return item.name in nullable
        if isinstance(item, Rep):
            return leftmost(item.item, out) or item.min == 0
        assert isinstance(item, Alt)
        empty = False
        for seq in item.options:
            empty |= all(leftmost(i, out) for i in seq)
        return empty

    starts = {}
    for name, alt in grammar.rules.items():
        out: set[str] = set()
        leftmost(alt, out)
        starts[name] = out
    for index, name in enumerate(grammar.rules):
        seen, todo = set(), list(starts[name])
        while todo:
            current = todo.pop()
            if current == name:
                raise GrammarError(f"unsupported grammar, left recursion detected for nonterminal at index {index}")
            if current not in seen:
                seen.add(current)
                todo.extend(starts[current])


_PRINTABLE = tuple(range(32, 127))
_SOFT_LIMIT = 48
"""Characters after which `generate` only takes the shortest way to the end."""


class _Walker:
    def __init__(self, grammar: Grammar, rng: random.Random, soft_limit: int) -> None:
        self.grammar = grammar
        self.rng = rng
        self.soft_limit = soft_limit
        self.out: list[str] = []
        self.size = 0
        self.cost = _shortest(grammar)

    def cost_of(self, item: object) -> int:
        if isinstance(item, Lit):
            return len(item.text)
        if isinstance(item, CharClass):
            return 1
        if isinstance(item, Ref):
            return self.cost[item.name]
        if isinstance(item, Rep):
            return item.min * self.cost_of(item.item)
        assert isinstance(item, Alt)
        return min(sum(self.cost_of(i) for i in seq) for seq in item.options)

    def emit(self, text: str) -> None:
        self.out.append(text)
        self.size += len(text)

    def walk(self, item: object, depth: int) -> None:
        if depth > 600:  # a rule that never ends (llama.cpp accepts it): cut, as max_tokens would
            return
        long = self.size >= self.soft_limit or depth > 40
        if isinstance(item, Lit):
            self.emit(item.text)
        elif isinstance(item, CharClass):
            self.emit(chr(self._pick_char(item)))
        elif isinstance(item, Ref):
            self.walk(self.grammar.rules[item.name], depth + 1)
        elif isinstance(item, Rep):
            extra = 0
            if not long:
                room = 3 if item.max is None else item.max - item.min
                extra = self.rng.randint(0, min(room, 3))
            for _ in range(item.min + extra):
                self.walk(item.item, depth + 1)
        else:
            assert isinstance(item, Alt)
            options = item.options
            costs = [sum(self.cost_of(i) for i in seq) for seq in options]
            finite = [seq for seq, c in zip(options, costs, strict=True) if c < _INFINITE]
            if long or not finite:
                best = min(costs)
                finite = [seq for seq, c in zip(options, costs, strict=True) if c == best]
            for part in self.rng.choice(finite):
                self.walk(part, depth + 1)

    def _pick_char(self, cls: CharClass) -> int:
        def inside(code: int) -> bool:
            return any(lo <= code <= hi for lo, hi in cls.ranges)

        printable = [c for c in _PRINTABLE if inside(c) != cls.negated]
        if cls.negated and not cls.ranges:  # `.`: a letter reads better than punctuation
            printable = [c for c in printable if chr(c).isalpha()]
        if printable:
            return self.rng.choice(printable)
        if not cls.negated:
            lo, hi = self.rng.choice(cls.ranges)
            return self.rng.randint(lo, hi)
        return next(c for c in range(0x100, 0x110000) if not inside(c))


_INFINITE = 10**9


def _shortest(grammar: Grammar) -> dict[str, int]:
    """Length of each rule's shortest string (a fixed point; _INFINITE when it never ends)."""
    cost = {name: _INFINITE for name in grammar.rules}

    def of(item: object) -> int:
        if isinstance(item, Lit):
            return len(item.text)
        if isinstance(item, CharClass):
            return 1
        if isinstance(item, Ref):
            return cost[item.name]
        if isinstance(item, Rep):
            return min(item.min * of(item.item), _INFINITE)
        assert isinstance(item, Alt)
        return min(min(sum(of(i) for i in seq), _INFINITE) for seq in item.options)

    changed = True
    while changed:
        changed = False
        for name, alt in grammar.rules.items():
            value = of(alt)
            if value < cost[name]:
                cost[name] = value
                changed = True
    return cost


def generate(grammar: Grammar, rng: random.Random, soft_limit: int = _SOFT_LIMIT) -> str:
    """A string `grammar` accepts from its root, drawn from `rng` (the same draws give the same string)."""
    walker = _Walker(grammar, rng, soft_limit)
    walker.walk(Ref("root"), 0)
    return "".join(walker.out)
