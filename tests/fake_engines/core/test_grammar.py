import random
import re

import pytest

from fake_engines.core._grammar import GrammarError, generate, parse_grammar

JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
# optional space
ws ::= | " " | "\n" [ \t]{0,20}
'''


@pytest.mark.parametrize("grammar,pattern", [
    ('root ::= "a"{5,5}', r"a{5}"),
    ('root ::= [0-9]+ ("." [0-9]+)?', r"[0-9]+(\.[0-9]+)?"),
    ('root ::= ("yes" | "no") " " name\nname ::= [A-Z] [a-z]{2,6}', r"(yes|no) [A-Z][a-z]{2,6}"),
    ('root ::= item ("," item)*\nitem ::= "x" | "(" root ")"', r"[x(),]+"),
    ('root ::= .+ "!"', r"[a-zA-Z]+!"),
])
def test_generated_text_is_accepted_by_the_grammar_and_deterministic_per_seed(grammar, pattern):
    parsed = parse_grammar(grammar)
    texts = [generate(parsed, random.Random(seed)) for seed in range(20)]
    assert all(re.fullmatch(pattern, t) for t in texts), texts
    assert texts == [generate(parsed, random.Random(seed)) for seed in range(20)]


def test_json_grammar_generates_json_that_parses():
    import json

    parsed = parse_grammar(JSON_GBNF)
    for seed in range(30):
        assert isinstance(json.loads(generate(parsed, random.Random(seed))), dict)


@pytest.mark.parametrize("grammar,message", [
    ("root ::= this is (not valid GBNF", "expecting ')'"),
    ('root ::= "a" b', "Undefined rule identifier 'b'"),
    ('r ::= "a"', "does not contain a 'root' symbol"),
    ('root ::= x\nx ::= x "a"', "left recursion"),
    ('root ::= "x"{3000}', "number of repetitions exceeds sane defaults"),
    ('root ::= "a" *', None),  # a repetition of the literal before it: fine
    ('root ::= * "a"', "expecting preceding item"),
    ('root ::= "\\q"', "unknown escape"),
])
def test_grammars_llama_cpp_refuses_are_refused_with_its_reason(grammar, message):
    if message is None:
        parse_grammar(grammar)
        return
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_grammar(grammar)
