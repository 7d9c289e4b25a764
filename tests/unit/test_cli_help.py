"""The CLI's help at 80 columns, as a terminal shows it: option names whole, one-line command
descriptions that end where their sentence ends, flags without a metavar, and the exit codes
said once, in ``millstream --help``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from millstream.errors import EXIT_FAMILIES


def _help(*command: str) -> str:
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"}
    done = subprocess.run(
        [sys.executable, "-c", "from millstream.cli.app import main; main()", *command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_run_help_at_80_columns_shows_every_option_whole() -> None:
    text = _help("run")
    assert "--maintenance-interval SECONDS" in text
    assert "--available-now " in text
    assert "…" not in text and "<bool>" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    # A paragraph reads as one: the description is rewrapped, not broken where the source was.
    assert "Ctrl-C (or SIGTERM) stops at a\n  batch boundary, prints a summary and exits 0." in text


@pytest.mark.parametrize("group", [(), ("datastream",), ("table",)])
def test_command_lists_say_one_whole_sentence_per_command(group: tuple[str, ...]) -> None:
    text = _help(*group)
    commands = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(commands) >= 4
    for line in commands:
        assert line.endswith(".") and not line.endswith("..."), line
        assert len(line) <= 80


def test_exit_codes_are_listed_once_in_the_top_level_help() -> None:
    top = " ".join(_help().split()).replace("-and- set", "-and-set")
    for code, meaning in EXIT_FAMILIES.items():
        assert f"{code} {meaning}" in top
    assert "404 exits 3" in top  # how a refused REST call exits
    for command in (("datastream", "create"), ("segments",), ("table", "list"), ("query",)):
        assert "commit outcome unknown" not in _help(*command), command
