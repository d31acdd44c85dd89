import pytest

from loadgen.readers import TraceFormatError, burstgpt, detect_format
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


def test_reads_the_original_six_columns():
    reqs = list(burstgpt.read(DATA / "burstgpt.handwritten.csv"))
    assert len(reqs) == 5
    first = reqs[0]
    assert (first.timestamp_s, first.input_length, first.output_length) == (5.0, 472, 18)
    assert first.extra == {"burstgpt_model": "ChatGPT", "log_type": "Conversation log"}
    assert first.model is None and first.session_id is None
    # a failed request in BurstGPT has zero response tokens; it is kept, not dropped
    assert reqs[3].output_length == 0


def test_reads_session_id_and_elapsed_time_of_release_two():
    reqs = list(burstgpt.read(DATA / "burstgpt.with_sessions.handwritten.csv"))
    assert [r.session_id for r in reqs] == ["s1", "s1", "s2", None]
    assert reqs[1].service_time_s == 7.25
    assert reqs[3].service_time_s is None


def test_both_headers_are_recognised_as_burstgpt():
    assert detect_format(DATA / "burstgpt.handwritten.csv") == "burstgpt"
    assert detect_format(DATA / "burstgpt.with_sessions.handwritten.csv") == "burstgpt"


@pytest.mark.parametrize("row,message", [
    ("1,ChatGPT,x,4,5,Conversation log", 'Request tokens="x": must be a non-negative integer'),
    ("soon,ChatGPT,3,4,7,Conversation log", 'Timestamp="soon": must be a finite number'),
    ("inf,ChatGPT,3,4,7,Conversation log", 'Timestamp="inf": must be a finite number'),
])
def test_a_cell_of_the_wrong_type_names_its_column_and_line(tmp_path, row, message):
    bad = tmp_path / "burst.csv"
    bad.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   "0,ChatGPT,3,4,7,Conversation log\n" + row + "\n")
    with pytest.raises(TraceFormatError) as exc:
        list(burstgpt.read(bad))
    assert str(exc.value) == f"{bad}:3: bad BurstGPT row: {message}"
