"""Mirror discovery from the machine's apt sources (one-line and deb822 formats)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.images.sources import find_mirror, parse_deb822, parse_one_line, read_sources

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://one.example/debian bookworm main contrib
deb http://one.example/debian-security bookworm-security main  # trailing comment
deb http://one.example/debian bookworm-updates main
"""

DEB822 = """\
# a comment before the first stanza
Types: deb
URIs: http://two.example/debian
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://two.example/debian-security
Suites: trixie-security
Components: main

Types: deb deb-src
Enabled: no
URIs: http://disabled.example/debian
Suites: sid
Components: main
"""


def _apt_dir(tmp_path: Path, *, sources_list: str = "", parts: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(sources_list)
    for name, text in parts.items():
        (tmp_path / "sources.list.d" / name).write_text(text)
    return tmp_path


def test_one_line_entries_skip_comments_options_and_source_packages() -> None:
    entries = [e for e in parse_one_line(ONE_LINE) if "deb" in e.types]
    assert [(e.uris[0], e.suites[0]) for e in entries] == [
        ("http://one.example/debian", "bookworm"),
        ("http://one.example/debian-security", "bookworm-security"),
        ("http://one.example/debian", "bookworm-updates"),
    ]
    assert entries[0].components == ("main", "contrib")


def test_deb822_stanzas_carry_every_suite_and_the_enabled_flag() -> None:
    entries = list(parse_deb822(DEB822))
    assert entries[0].suites == ("trixie", "trixie-updates")
    assert entries[0].uris == ("http://two.example/debian",)
    assert entries[2].types == ("deb", "deb-src")
    assert entries[2].enabled is False


def test_the_mirror_serving_the_suite_is_found_in_a_one_line_sources_list(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, sources_list=ONE_LINE, parts={})
    assert find_mirror("bookworm", apt_dir=apt) == "http://one.example/debian"


def test_the_mirror_serving_the_suite_is_found_in_a_deb822_file(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, parts={"debian.sources": DEB822})
    assert find_mirror("trixie", apt_dir=apt) == "http://two.example/debian"


def test_security_and_updates_entries_are_never_the_mirror(tmp_path: Path) -> None:
    only_partial = "deb http://p.example/debian-security bookworm-security main\n"
    apt = _apt_dir(tmp_path, sources_list=only_partial, parts={})
    assert find_mirror("bookworm", apt_dir=apt) is None


def test_disabled_entries_and_other_file_suffixes_are_ignored(tmp_path: Path) -> None:
    disabled = "Types: deb\nEnabled: no\nURIs: http://off.example/debian\nSuites: sid\n"
    apt = _apt_dir(
        tmp_path,
        parts={
            "off.sources": disabled,
            "old.list.disabled": "deb http://old.example/debian sid main\n",
        },
    )
    assert find_mirror("sid", apt_dir=apt) is None
    assert [e.uris for e in read_sources(apt)] == [("http://off.example/debian",)]


def test_a_suite_no_entry_names_falls_back_to_a_release_suite_mirror(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, parts={"debian.sources": DEB822})
    assert find_mirror("bookworm", apt_dir=apt) == "http://two.example/debian"


def test_transports_debootstrap_cannot_use_are_skipped(tmp_path: Path) -> None:
    text = "deb mirror+file:/etc/apt/mirrors.txt bookworm main\ndeb cdrom:/media bookworm main\n"
    apt = _apt_dir(tmp_path, sources_list=text, parts={})
    assert find_mirror("bookworm", apt_dir=apt) is None


def test_a_machine_without_apt_sources_has_no_mirror(tmp_path: Path) -> None:
    assert find_mirror("bookworm", apt_dir=tmp_path / "missing") is None
