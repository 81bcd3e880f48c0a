"""A template's wheels download says how far it is (issue 32.6): each file pip starts to fetch
becomes a running count of files and megabytes; every other line passes unchanged. Pure logic,
with pip's own line formats."""

from __future__ import annotations

from orchestrator.images.template_wheels import DownloadTally


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, name: str) -> None:
        self.lines.append(f"step {name}")

    def log(self, line: str) -> None:
        self.lines.append(line)

    def done(self, name: str) -> None:
        self.lines.append(f"done {name}")


def test_each_download_is_counted_with_its_size_and_other_lines_pass() -> None:
    seen = Lines()
    tally = DownloadTally(seen, total_files=3)
    tally.log("Collecting numpy==2.1.3 (from -r /tmp/x/.requirements.lock (line 1))")
    tally.log(
        "  Downloading https://files.pythonhosted.org/packages/aa/bb/"
        "numpy-2.1.3-cp311-cp311-manylinux_2_17_x86_64.whl (16.3 MB)"
    )
    tally.log("  Downloading six-1.17.0-py2.py3-none-any.whl (11 kB)")
    tally.log("Saved /tmp/x/six-1.17.0-py2.py3-none-any.whl")
    assert seen.lines == [
        "Collecting numpy==2.1.3 (from -r /tmp/x/.requirements.lock (line 1))",
        "1 of 3 wheels, 16.3 MB downloaded: numpy-2.1.3-cp311-cp311-manylinux_2_17_x86_64.whl",
        "2 of 3 wheels, 16.3 MB downloaded: six-1.17.0-py2.py3-none-any.whl",
        "Saved /tmp/x/six-1.17.0-py2.py3-none-any.whl",
    ]
    assert tally.files == 2 and tally.bytes == 16_300_000 + 11_000
