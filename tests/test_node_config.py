"""The server's configuration: flags and the --config file give the same settings."""
from __future__ import annotations

import json

from gesmas.client.cli import build_parser
from gesmas.server.node import Node, config_from_args


def args(*argv: str):
    return build_parser().parse_args(["server", "--id", "1", "--client-addr", "127.0.0.1:1",
                                      "--raft-addr", "127.0.0.1:2", *argv])


def test_skip_entries_from_flags_and_config_file_reach_the_kernel(tmp_path):
    cfg = config_from_args(args("--skip-entry", "7", "--skip-entry", "9"))
    assert cfg.skip_entries == frozenset({7, 9})
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"skip_entries": [12]}))
    assert config_from_args(args("--config", str(path))).skip_entries == frozenset({12})
    assert config_from_args(args()).skip_entries == frozenset()
    kernel = Node(cfg).make_state_machine().kernel
    assert kernel.config.skip_entries == frozenset({7, 9})
