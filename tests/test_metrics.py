"""grpokit.metrics: metrics.jsonl read back on resume; damaged files give one-line errors naming them."""

from __future__ import annotations

import json

import pytest

from grpokit.metrics import RunLogger, read_metrics


def _lines(*steps):
    return b"".join(json.dumps({"step": s, "loss": 0.5}).encode() + b"\n" for s in steps)


def test_truncate_after_keeps_earlier_steps_and_drops_a_torn_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(_lines(1, 2, 3) + b'{"step": 4, "lo')
    RunLogger(tmp_path, tensorboard=False).truncate_after(2)
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize("name", ["metrics.jsonl", "samples.jsonl"])
def test_truncate_after_on_a_non_utf8_file_names_it_and_leaves_it(tmp_path, name):
    content = _lines(1) + b'{"step": 2, "text": "caf\xe9"}\n'
    (tmp_path / name).write_bytes(content)
    offset = len(_lines(1)) + len(b'{"step": 2, "text": "caf')
    with pytest.raises(ValueError) as e:
        RunLogger(tmp_path, tensorboard=False).truncate_after(1)
    assert str(e.value) == (f"{tmp_path / name}: line 2: not valid UTF-8 (byte 0xe9 at offset {offset} of the"
                            f" file); repair or remove it to resume in {tmp_path}")
    assert (tmp_path / name).read_bytes() == content


def test_read_metrics_damaged_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_bytes(_lines(1) + b"\xff\n")
    with pytest.raises(ValueError, match=rf"line 2: not valid UTF-8 \(byte 0xff at offset {len(_lines(1))} "):
        read_metrics(p)
    p.write_bytes(_lines(1) + b"{oops\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        read_metrics(p)


def test_a_fresh_run_replaces_a_non_utf8_metrics_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(_lines(1) + b"\xe9\n")
    RunLogger(tmp_path, tensorboard=False).truncate_after(0)
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""
