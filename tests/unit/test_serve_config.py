"""``sandhold serve --config``: the file's settings, validated like a policy, and the options
that override it (pure logic; against a real server: tests/docker/test_serve_ops.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli._serve_config import ServeSettings, resolve_settings
from orchestrator.errors import ConfigFileError

DEFAULTS = {name: field.default for name, field in ServeSettings.model_fields.items()}
FROM_DEFAULT = {name: SimpleNamespace(name="DEFAULT") for name in DEFAULTS}


def test_the_file_sets_what_no_option_gave_and_paths_are_relative_to_it(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "sandhold.toml"
    config.parent.mkdir()
    config.write_text('port = 9000\ntenants = "tenants.toml"\ndata_dir = "/srv/sandhold"\n')
    settings = resolve_settings(config, DEFAULTS, FROM_DEFAULT)
    assert settings.port == 9000 and settings.host == "127.0.0.1"
    assert settings.tenants == tmp_path / "etc" / "tenants.toml"
    assert settings.data_dir == Path("/srv/sandhold")


@pytest.mark.parametrize("source", ["COMMANDLINE", "ENVIRONMENT"])
def test_an_option_given_on_the_command_line_or_environment_wins(
    tmp_path: Path, source: str
) -> None:
    config = tmp_path / "sandhold.toml"
    config.write_text("pool = 3\nmax_sessions = 7\n")
    sources = {**FROM_DEFAULT, "pool": SimpleNamespace(name=source)}
    settings = resolve_settings(config, {**DEFAULTS, "pool": 1}, sources)
    assert settings.pool == 1 and settings.max_sessions == 7


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("prot = 1\n", "prot"),
        ('port = "eighty"\n', "port"),
        ("max_sessions = 0\n", "max_sessions"),
        ('log_format = "xml"\n', "log_format"),
        ("port = [\n", "-"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, key: str) -> None:
    config = tmp_path / "sandhold.toml"
    config.write_text(text)
    with pytest.raises(ConfigFileError) as refused:
        resolve_settings(config, DEFAULTS, FROM_DEFAULT)
    assert refused.value.file == str(config) and refused.value.key == key
    assert refused.value.code == "invalid_argument"
