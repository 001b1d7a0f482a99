"""Trace readers: good files, malformed rows named by file and line, the
optional tier column, zero-token rows counted, the real Azure files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiertp.traces import NAMED_TRACES, TraceError, load_trace, read_file

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.7805900,879,55
"""

BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5.0,ChatGPT,472,18,490,Conversation log
7.5,GPT-4,1087,0,1087,Conversation log
9.25,ChatGPT,300,250,550,API log
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_reads_sorts_and_rebases(tmp_path):
    t = read_file(write(tmp_path, "a.csv", AZURE))
    assert t.source == "a" and len(t) == 3
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.1, 4.314579], atol=1e-6)
    assert t.prompt_tokens.tolist() == [374, 879, 396]
    assert t.output_tokens.tolist() == [44, 55, 109]
    assert t.tier.tolist() == [-1, -1, -1] and not t.has_tiers
    assert t.start_epoch_s == pytest.approx(1700158546.68059)


def test_burstgpt_counts_zero_response_rows(tmp_path):
    t = read_file(write(tmp_path, "b.csv", BURST))
    assert t.arrival_s.tolist() == [0.0, 4.25]
    assert t.prompt_tokens.tolist() == [472, 300]
    assert t.skipped == {"zero output tokens": 1}


def test_mooncake_ms_timestamps_and_tier_key(tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1], "tier": "agent"},
        {"timestamp": 1500, "input_length": 100, "output_length": 5, "hash_ids": [], "tier": "chat"},
        {"timestamp": 3000, "input_length": 10, "output_length": 7, "hash_ids": [2], "tier": "agent"},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    t = read_file(path)
    assert t.arrival_s.tolist() == [0.0, 0.5, 2.0]
    assert t.tier_names == ("agent", "chat") and t.tier.tolist() == [0, 1, 0] and t.has_tiers


def test_tier_column_honoured_in_csv(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens,Tier\n0.0,10,2,chat\n1.0,20,3,agent\n"
    t = read_file(write(tmp_path, "t.csv", text), "azure")
    assert t.tier_of() == ["chat", "agent"]


@pytest.mark.parametrize(
    "name, text, line, needle",
    [
        ("a.csv", AZURE.replace("396,109", "396,-3"), 3, "field `GeneratedTokens`"),
        ("a.csv", AZURE.replace("879,55", "879"), 4, "expected 3 fields"),
        ("a.csv", AZURE.replace("2023-11-16 18:15:50.9951690", "yesterday"), 3, "field `TIMESTAMP`"),
        ("a.csv", AZURE.replace("374,44", "3x4,44"), 2, "field `ContextTokens`"),
        ("b.csv", BURST.replace("9.25", "-1"), 4, "field `Timestamp`"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,tier\n0,1,1,\n", 2, "empty tier name"),
    ],
)
def test_malformed_csv_rows_name_file_and_line(tmp_path, name, text, line, needle):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as e:
        read_file(path)
    assert f"{path}:{line}:" in str(e.value) and needle in str(e.value)
    assert e.value.line == line


@pytest.mark.parametrize(
    "row, needle",
    [
        ('{"timestamp": 1, "input_length": 3}', "missing key(s) ['output_length']"),
        ('{"timestamp": 1, "input_length": 3, "output_length": 2.5}', "field `output_length`"),
        ('{"timestamp": "soon", "input_length": 3, "output_length": 2}', "field `timestamp`"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_malformed_mooncake_rows_name_file_and_line(tmp_path, row, needle):
    good = '{"timestamp": 0, "input_length": 3, "output_length": 2}'
    path = write(tmp_path, "m.jsonl", f"{good}\n{good}\n{row}\n")
    with pytest.raises(TraceError) as e:
        read_file(path)
    assert f"{path}:3:" in str(e.value) and needle in str(e.value)


def test_header_and_format_problems(tmp_path):
    with pytest.raises(TraceError, match=r"x.csv:1: header lacks column\(s\) \['GeneratedTokens'\]"):
        read_file(write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens\n1,2\n"), "azure")
    with pytest.raises(TraceError, match="cannot tell the format from the header"):
        read_file(write(tmp_path, "y.csv", "a,b\n1,2\n"))
    with pytest.raises(TraceError, match="prefix the path with one of azure:, burstgpt:, mooncake:"):
        read_file(write(tmp_path, "z.parquet", ""))
    with pytest.raises(TraceError, match="empty file"):
        read_file(write(tmp_path, "e.csv", ""), "azure")


def test_specs_resolve_prefixes_and_fail_listing_valid_names(tmp_path):
    path = write(tmp_path, "burst.txt", BURST)
    assert len(load_trace(f"burstgpt:{path}")) == 2
    with pytest.raises(TraceError) as e:
        load_trace("azure-chat")
    for name in [*NAMED_TRACES, "mooncake:", "synthetic:"]:
        assert name in str(e.value)
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        read_file(path, "parquet")


@pytest.mark.parametrize("name, rows", [("azure-conv", 19_366), ("azure-code", 8_819)])
def test_real_azure_traces(name, rows):
    try:
        t = load_trace(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert len(t) == rows and t.skipped == {}
    assert t.arrival_s[0] == 0.0 and 3300 < t.span_s < 3600
    assert np.all(np.diff(t.arrival_s) >= 0)
