import pytest

from loadgen.readers import TraceFormatError, azure
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces"


def test_reads_both_shared_azure_files_with_their_published_stats():
    code = list(azure.read(DATA / "AzureLLMInferenceTrace_code.before1845.csv"))
    conv = list(azure.read(DATA / "AzureLLMInferenceTrace_conv.before1845.csv"))
    assert (len(code), len(conv)) == (5100, 9754)
    assert round(sum(r.output_length for r in code) / len(code)) == 27
    assert round(sum(r.input_length for r in conv) / len(conv)) == 1238
    # 18:17:03.9799600 to 18:44:29.8265160 is 27.4 minutes
    assert code[-1].timestamp_s == pytest.approx(1645.852656, abs=1e-6)


def test_timestamps_are_seconds_after_the_first_row_to_the_microsecond():
    reqs = list(azure.read(DATA / "azure_code.first60s.csv"))
    assert [r.timestamp_s for r in reqs[:2]] == [0.0, 0.052]
    assert (reqs[0].input_length, reqs[0].output_length) == (4808, 10)
    assert len(reqs) == 63 and reqs[-1].timestamp_s == pytest.approx(39.327517)


def test_a_bad_row_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,x\n")
    with pytest.raises(TraceFormatError, match=r"bad.csv:2: bad Azure row"):
        list(azure.read(bad))


@pytest.mark.parametrize("row,message", [
    ("2023-11-16 18:17:03.9799600,12,x", 'GeneratedTokens="x": must be a non-negative integer'),
    ("2023-11-16 18:17:03.9799600,-4,1", 'ContextTokens="-4": must be a non-negative integer'),
    ("yesterday,12,1", 'TIMESTAMP="yesterday": must be a date and time'),
    ("2023-11-16 18:17:03.9799600,12", "GeneratedTokens is missing"),
])
def test_a_cell_of_the_wrong_type_names_its_column(tmp_path, row, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + row + "\n")
    with pytest.raises(TraceFormatError) as exc:
        list(azure.read(bad))
    assert str(exc.value).startswith(f"{bad}:2: bad Azure row: {message}")
