"""``.ci/gpu``'s bench command lines parse with today's CLI and name known encodings.

The script runs only on a lent GPU machine, whose time is short (15 minutes a session):
an option renamed here, or a misspelt method, would cost a device call to find out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pe_bench.harness.cli import _bench_methods, build_parser

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "gpu"

#: the script's shell expansions, as a run without extra arguments expands them
EXPANSIONS = {
    r'\$\{2:\+--methods "\$2"\}': "",
    r"\$\{2:-([^}]*)\}": r"\1",
    r"\$kernel": "dense",
    r'"\$OUT"|\$OUT': "/tmp/out",
}


def bench_commands() -> list[str]:
    """Every ``bench ...`` command of the script, continuation lines joined, output redirection cut."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        found = re.search(r"(?:\"\$cli\"|pe_bench)\s+(bench .*)", line)
        if found:
            command = found.group(1).split(" 2>&1")[0]
            for pattern, replacement in EXPANSIONS.items():
                command = re.sub(pattern, replacement, command)
            commands.append(command)
    return commands


def test_the_script_has_its_bench_commands():
    commands = bench_commands()
    assert len(commands) >= 10
    assert any("--attention-kernel dense" in command for command in commands)


@pytest.mark.parametrize("command", bench_commands())
def test_every_bench_command_parses_and_names_known_encodings(command):
    assert "$" not in command, f"an unexpanded shell variable in {command!r}"
    args = build_parser().parse_args(shlex.split(command))
    for option in ("methods", "sweep_methods", "profile_step"):
        value = getattr(args, option, None)
        if value:
            assert _bench_methods(value)  # raises, naming the method, if one is unknown
