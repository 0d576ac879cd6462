"""`aogpt serve` on the command line (its requests and faults: tests/serve/)."""

from __future__ import annotations

import socket


def test_a_port_in_use_is_one_line_before_the_model_loads(cli, tiny_run, monkeypatch):
    monkeypatch.setattr("aogpt.checkpoint.load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("serve", "--checkpoint", str(tiny_run), "--port", str(port))
    assert result.code == 2
    assert result.err.strip().splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use "
                                               "(pick another --port (0 picks a free one) or --host)"]


def test_the_server_binds_the_loopback_interface_by_default():
    from aogpt.cli import build_parser

    args = build_parser().parse_args(["serve", "--checkpoint", "run"])
    assert args.host == "127.0.0.1"


def test_serve_takes_a_seed_for_unseeded_requests(cli):
    result = cli("serve", "--help")
    assert result.code == 0 and "a request's own seed always wins" in " ".join(result.out.split())
    result = cli("serve", "--checkpoint", "nowhere", "--seed", "-1")
    assert result.code == 2 and "Traceback" not in result.err
    assert result.err.strip().splitlines()[-1].startswith("error: ")
