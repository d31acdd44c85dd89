from __future__ import annotations

import json

from flotilla.cli import main

SEED_EXAMPLES_2_3 = """\
one device   : [  -5  -3   4   6  -2  -5 ] [   1   7   3  -6  -5   1 ]
device 0     : [  -5  -3   4 ] [   1   7   3 ]
device 1     : [   6  -2  -5 ] [  -6  -5   1 ]
concatenated : [  -5  -3   4   6  -2  -5 ] [   1   7   3  -6  -5   1 ]
equal to one device: true
weights per device: 12 of 24; both devices need all of x

device 0 partial : [    0    0    0    0 ] [    9   25   11  -33 ]
device 1 partial : [  -28  -10    8   26 ] [   -5    0    5   10 ]
all-reduce sum   : [  -28  -10    8   26 ] [    4   25   16  -23 ]
one device       : [  -28  -10    8   26 ] [    4   25   16  -23 ]
equal: true
A split by rows, ReLU before the sum, equal: false
"""


def test_prints_examples_2_and_3(capsys):
    assert main(["plan", "tp-demo"]) == 0
    assert capsys.readouterr().out == SEED_EXAMPLES_2_3


def test_json_carries_the_same_results(capsys):
    assert main(["plan", "tp-demo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mlp_split"]["all_reduce_sum"] == [[-28, -10, 8, 26], [4, 25, 16, -23]]
    assert doc["mlp_split"]["rows_split_equal"] is False
    assert doc["column_split"]["weights_per_device"] == 12
