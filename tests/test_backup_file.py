"""The backup file (gesmas.protocol.backups) on its own, no cluster: what a careless or hostile
header gets (each refusal names what is wrong), and the atomic write. The damaged copies of a
real backup, and its restore, are in test_backup.py."""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib

import pytest

from gesmas.protocol import backups

BLOB = b"checkpoint bytes" * 10


def header(**changes):
    return dataclasses.replace(backups.header_for(
        BLOB, index=7, state_digest="ab" * 32, checkpoint_format=4,
        members=["127.0.0.1:2", "127.0.0.1:1"], node_id="127.0.0.1:1", created=1.5), **changes)


def crafted(fields: dict, blob: bytes = BLOB) -> bytes:
    """A file whose header is `fields` as JSON, with a correct CRC."""
    raw = json.dumps(fields).encode()
    return backups.MAGIC + struct.pack(">I", len(raw)) + raw + \
        struct.pack(">I", zlib.crc32(raw)) + blob


def good_fields() -> dict:
    return dataclasses.asdict(header())


def refused(tmp_path, data: bytes) -> str:
    path = tmp_path / "x.bak"
    path.write_bytes(data)
    with pytest.raises(backups.BadBackup) as e:
        backups.read(str(path))
    return str(e.value)


def test_a_written_backup_reads_back_the_same(tmp_path):
    path = str(tmp_path / "b.bak")
    backups.write(path, header(), BLOB)
    assert backups.read(path) == (header(), BLOB)
    assert os.listdir(tmp_path) == ["b.bak"]           # no temporary file left
    backups.write(path, header(index=9), BLOB)         # replaced whole
    assert backups.read(path)[0].index == 9


def test_write_refuses_a_header_that_does_not_describe_the_bytes(tmp_path):
    path = str(tmp_path / "b.bak")
    for bad, reason in ((header(size=3), "the header says 3"),
                        (header(sha256="0" * 64), "SHA-256"),
                        (header(index=1), "index 1"),
                        (header(state_digest=""), "no state digest")):
        with pytest.raises(backups.BadBackup, match=reason):
            backups.write(path, bad, BLOB)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change, reason", [
    ({"format": 2}, "format 2 is not 1"),
    ({"format": None}, "format None"),
    ({"index": "7"}, "'index' is missing or of the wrong type"),
    ({"size": True}, "'size' is missing or of the wrong type"),
    ({"members": "127.0.0.1:1"}, "'members' is missing or of the wrong type"),
    ({"members": [1, 2]}, "must list Raft addresses"),
    ({"extra": 1}, "unknown header fields ['extra']"),
])
def test_a_header_with_wrong_fields_is_refused_naming_them(tmp_path, change, reason):
    fields = good_fields()
    fields.update(change)
    assert reason in refused(tmp_path, crafted(fields))


def test_a_header_missing_a_field_or_not_an_object_is_refused(tmp_path):
    fields = good_fields()
    del fields["state_digest"]
    assert "'state_digest' is missing" in refused(tmp_path, crafted(fields))
    raw = b"[1, 2]"
    assert "not a JSON object" in refused(tmp_path, backups.MAGIC + struct.pack(">I", len(raw))
                                          + raw + struct.pack(">I", zlib.crc32(raw)) + BLOB)
    raw = b"{not json"
    assert "not JSON" in refused(tmp_path, backups.MAGIC + struct.pack(">I", len(raw))
                                 + raw + struct.pack(">I", zlib.crc32(raw)) + BLOB)


def test_an_implausible_header_length_is_refused_before_reading_it(tmp_path):
    data = backups.MAGIC + struct.pack(">I", 0xFFFFFFFF) + b"{}"
    assert "not plausible" in refused(tmp_path, data)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    assert "not a gesmas backup" in refused(tmp_path, b"")
    with pytest.raises(backups.BadBackup, match="cannot read backup"):
        backups.read(str(tmp_path / "missing.bak"))
    with pytest.raises(backups.BadBackup, match="cannot read backup"):
        backups.read(str(tmp_path))                    # a directory
