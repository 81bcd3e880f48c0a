"""What the quick commands import, checked by name rather than timed: ``sandhold --help``,
``ps``, ``kill`` and ``policy check`` start in a fraction of a second only while none of them
imports the MCP SDK, the HTTP server, the orchestrator or the image builder (issue 21). Each
command runs as the console script does, in a fresh interpreter, and its ``sys.modules`` is read
when it exits; ``ps`` and ``kill`` are pointed at an engine socket that does not exist, so they
fail at their first engine request with everything they need imported.

The help of every command is also checked against the app with every command registered: the
entry point registers only the command it runs, and that must not change what its help says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator._resources import shipped_policies_dir

# Runs the entry point with the given arguments, then writes the imported modules' names.
DRIVER = """
import json, sys
out, sys.argv = sys.argv[1], ["sandhold", *sys.argv[2:]]
from orchestrator.cli import main
try:
    main()
except SystemExit:
    pass
with open(out, "w") as handle:
    json.dump(sorted(sys.modules), handle)
"""

# The entry point as the console script runs it (the program name in the usage line included).
AS_SANDHOLD = "import sys; sys.argv[0] = 'sandhold'; from orchestrator.cli import main; main()"

# Never needed by these commands; each costs tens to hundreds of milliseconds to import.
HEAVY = (
    "mcp",
    "mcp_types",
    "uvicorn",
    "starlette",
    "sse_starlette",
    "httpx2",
    "orchestrator._api",
    "orchestrator._core.manager",
    "orchestrator._core.tenants",
    "orchestrator.audit",
    "orchestrator.http._app",
    "orchestrator.http._auth",
    "orchestrator.http._server",
    "orchestrator.images",
    "orchestrator.images.build",
    "orchestrator.mcp_server.server",
    "orchestrator.policy_ci.runner",
    "orchestrator.session.session",
    "orchestrator.tools",
)
# Besides: what a command that never talks to the engine or reads a policy has no use for.
ENGINE = ("docker", "requests", "urllib3", "orchestrator.backend.docker")
POLICY_MODEL = ("orchestrator.policy.model",)
UNREACHABLE_ENGINE = "unix:///nonexistent/sandhold-test-docker.sock"


def imported_by(args: list[str], tmp_path: Path) -> set[str]:
    out = tmp_path / "modules.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")},
        "SANDHOLD_DATA_DIR": str(tmp_path / "data"),
        "DOCKER_HOST": UNREACHABLE_ENGINE,
    }
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.exists(), done.stderr
    return set(json.loads(out.read_text()))


def heavy_in(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


POLICY_FILE = str(shipped_policies_dir() / "default.toml")


QUICK = [
    (["--help"], ENGINE + POLICY_MODEL),
    (["ps", "--help"], ENGINE + POLICY_MODEL),
    (["kill", "--help"], ENGINE + POLICY_MODEL),
    (["serve", "--help"], ENGINE + POLICY_MODEL),
    (["policy", "check", POLICY_FILE], ENGINE),
    (["ps"], ()),
    (["ps", "--json"], ()),
    (["kill", "no-such-session"], ()),
]


@pytest.mark.parametrize(
    ("args", "also_forbidden"),
    [
        pytest.param(*case, id=" ".join(case[0]).replace(POLICY_FILE, "default.toml"))
        for case in QUICK
    ],
)
def test_a_quick_command_imports_nothing_heavy(
    args: list[str], also_forbidden: tuple[str, ...], tmp_path: Path
) -> None:
    modules = imported_by(args, tmp_path)
    assert "orchestrator.cli" in modules  # the driver ran the entry point
    assert heavy_in(modules, HEAVY + also_forbidden) == []


def test_ps_and_kill_do_reach_for_the_engine(tmp_path: Path) -> None:
    # The other side of the test above: the engine client is imported when a command needs it,
    # so an empty list of heavy modules means the command ran, not that it stopped early.
    for args in (["ps"], ["kill", "no-such-session"]):
        assert "orchestrator.backend.docker" in imported_by(args, tmp_path)


def _top_level() -> list[list[str]]:
    """``sandhold`` and each of its commands and groups (what the entry point registers alone;
    a group's subcommands come with it, the same either way)."""
    from orchestrator.cli import COMMANDS, GROUPS

    return [[], *([name] for name, _, _ in (*GROUPS, *COMMANDS))]


def test_every_command_of_the_app_is_in_the_table() -> None:
    from orchestrator.cli import register

    root = typer.main.get_command(register())
    assert {name for [name] in _top_level()[1:]} == set(getattr(root, "commands", {}))


@pytest.mark.parametrize("path", _top_level(), ids=lambda path: " ".join(path) or "sandhold")
def test_help_through_the_entry_point_is_that_of_the_whole_app(path: list[str]) -> None:
    from orchestrator.cli import register

    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    whole = CliRunner().invoke(register(), [*path, "--help"], env=env, prog_name="sandhold")
    assert whole.exit_code == 0, whole.output
    alone = subprocess.run(
        [sys.executable, "-c", AS_SANDHOLD, *path, "--help"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout == whole.output
