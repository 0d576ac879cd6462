"""`aogpt.cli.main`: what a command that stops unexpectedly, or no command at all, looks like to the user."""

from __future__ import annotations

import subprocess
import sys


def test_a_reader_that_goes_away_gets_no_traceback():
    """`aogpt ... | head -1`: when the reader closes the pipe, the command stops quietly (exit 141,
    as a shell reports SIGPIPE), never with a BrokenPipeError traceback."""
    code = ("import sys, aogpt.cli as c, aogpt.cli.prepare as p\n"
            "def flood(args):\n"
            "    for _ in range(10**6):\n"
            "        print('x' * 100)\n"
            "p.run = flood\n"
            "def add(sub, _orig=p.add_parser):\n"
            "    _orig(sub)\n"
            "    sub.choices['prepare'].set_defaults(func=flood)\n"
            "p.add_parser = add\n"
            "sys.exit(c.main(['prepare']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_no_command_is_one_error_line_and_help_is_the_usage(cli):
    """Plain `aogpt` is bad input like any other (one line, exit 2, pointing to --help); `--help`
    prints the usage with every command and exits 0."""
    result = cli()
    assert (result.code, result.out, result.err) == (2, "", "error: no command given (run aogpt --help)\n")
    result = cli("--help")
    assert result.code == 0 and result.err == ""
    assert result.out.startswith("usage: aogpt") and all(name in result.out for name in ("train", "sample", "eval"))
