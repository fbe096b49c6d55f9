"""The one JSONL reader: strict errors name file:line; tolerant mode drops only a torn last line."""

from __future__ import annotations

import logging

import pytest

from harness.textfiles import parse_json_line, read_jsonl


class Bad(ValueError):
    pass


def write(tmp_path, data: bytes):
    p = tmp_path / "f.jsonl"
    p.write_bytes(data)
    return p


def test_records_with_line_numbers_blank_lines_and_bom_skipped(tmp_path):
    p = write(tmp_path, b'\xef\xbb\xbf{"a": 1}\n\n  \n{"a": 2}\n')
    assert list(read_jsonl(p)) == [(1, {"a": 1}), (4, {"a": 2})]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"a": 1}\n{"a": \n{"a": 3}\n', r"f.jsonl:2: malformed JSON"),
        (b'{"a": 1}\n[1, 2]\n', r"f.jsonl:2: expected a JSON object, got list"),
        (b'{"a": 1}\n{"a": "\xe9"}\n', r"f.jsonl:2: not UTF-8 text \(byte 0xe9"),
        (b'{"a": 1}\n{"a": 2', r"f.jsonl:2: malformed JSON"),  # strict: a torn last line is an error too
    ],
)
def test_strict_errors_name_file_and_line(tmp_path, data, match):
    with pytest.raises(Bad, match=match):
        list(read_jsonl(write(tmp_path, data), Bad))


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(Bad, match="no such file"):
        list(read_jsonl(tmp_path / "nope.jsonl", Bad))


def test_tolerant_drops_only_a_torn_last_line(tmp_path, caplog):
    torn = write(tmp_path, b'{"a": 1}\n{"a": 2}\n{"a": "\xc3')  # killed mid-write, mid-character
    with caplog.at_level(logging.WARNING):
        assert [r for _, r in read_jsonl(torn, Bad, tolerant=True)] == [{"a": 1}, {"a": 2}]
    assert "torn last line" in caplog.text
    assert [r for _, r in read_jsonl(write(tmp_path, b'{"a": 1}\n{"a"\n\n'), Bad, tolerant=True)] == [{"a": 1}]
    with pytest.raises(Bad, match=r"f.jsonl:1: malformed JSON"):  # a bad line with a record after it
        list(read_jsonl(write(tmp_path, b'{"a"\n{"a": 2}\n'), Bad, tolerant=True))


def test_any_json_value_when_not_objects(tmp_path):
    assert [r for _, r in read_jsonl(write(tmp_path, b"[1]\n2\n"), objects=False)] == [[1], 2]
    with pytest.raises(Bad, match="row 3: malformed JSON"):
        parse_json_line(b"{", "x.jsonl:row 3", Bad)
