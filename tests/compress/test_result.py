"""One result type and one printer for both flows: the common keys, JSON alone with --json, the table otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flopwise.compress.llm import llm_result, summarize_llm
from flopwise.compress.result import COMMON_KEYS, CompressResult, print_result


def _measured(seconds: float, perplexity: float) -> dict:
    generation = {"median_s": seconds, "q1_s": seconds * 0.99, "q3_s": seconds * 1.01, "blocks": 5, "threads": 1,
                  "tokens_per_second": {"median": 4 / seconds, "low": 4 / (seconds * 1.01), "high": 4 / (seconds * 0.99)}}
    return {"perplexity": perplexity, "generation": generation, "disk_bytes": 4 * 2**20, "memory_bytes": 2**22}


def llm_record(out: Path, note: str = "") -> dict:
    measured = {"before": _measured(1.0, 10.0), "after": _measured(0.5, 10.2)}
    return summarize_llm("int8-weight-only", note, measured, threads=1, batch=1, new_tokens=4, out=out)


def test_the_llm_record_holds_the_common_keys_and_prints_as_json_alone(tmp_path, capsys):
    record = llm_record(tmp_path)
    assert set(COMMON_KEYS) <= set(record) and record["flow"] == "llm"
    print_result(llm_result(record, tmp_path), as_json=True)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(record))


def test_the_table_shows_the_rows_notes_with_brackets_and_the_next_step(tmp_path, capsys):
    print_result(llm_result(llm_record(tmp_path, note="2 linear(s) left in float [model.a, model.b]"), tmp_path))
    out = capsys.readouterr().out
    assert "perplexity (held-out)" in out and "2.00x faster" in out
    assert "note: 2 linear(s) left in float [model.a, model.b]" in out  # printed as is, not read as markup
    assert out.rstrip().endswith(f"compressed model: {tmp_path} (transformers loads it; try `flopwise generate {tmp_path} --prompt ...`)")


def test_a_record_without_the_common_keys_is_refused():
    with pytest.raises(ValueError, match="flow"):
        CompressResult(record={"method": "x", "out": "o", "threads": 1}, title="", columns=(), rows=())
