"""The worker image's content hash: stable for equal inputs, different when any input changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.images.worker import image_inputs_hash, worker_files, worker_tag

INPUTS: dict[str, Any] = {
    "dockerfile": b"ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n",
    "worker_files": [("main.py", b"print('hi')\n"), ("pkg/util.py", b"X = 1\n")],
    "wheels": [("psutil-7.2.2-cp36-abi3-manylinux_2_17_x86_64.whl", b"PK\x03\x04wheel")],
    "base_image_id": "sha256:" + "a" * 64,
}


def _hash(**changes: Any) -> str:
    return image_inputs_hash(**{**INPUTS, **changes})


def test_the_hash_is_stable_and_independent_of_file_order() -> None:
    reordered = list(reversed(INPUTS["worker_files"]))
    assert _hash() == _hash()
    assert _hash(worker_files=reordered) == _hash()


def test_the_hash_changes_with_the_dockerfile() -> None:
    assert _hash(dockerfile=INPUTS["dockerfile"] + b"USER 10001\n") != _hash()


def test_the_hash_changes_with_a_worker_file_content_or_name() -> None:
    assert (
        _hash(worker_files=[("main.py", b"print('bye')\n"), ("pkg/util.py", b"X = 1\n")]) != _hash()
    )
    assert (
        _hash(worker_files=[("main2.py", b"print('hi')\n"), ("pkg/util.py", b"X = 1\n")]) != _hash()
    )
    assert _hash(worker_files=INPUTS["worker_files"][:1]) != _hash()


def test_the_hash_changes_with_a_wheel() -> None:
    assert _hash(wheels=[(INPUTS["wheels"][0][0], b"PK\x03\x04other")]) != _hash()


def test_the_hash_changes_with_the_base_image_id() -> None:
    assert _hash(base_image_id="sha256:" + "b" * 64) != _hash()


def test_moving_bytes_between_inputs_changes_the_hash() -> None:
    moved = [("main.py", b"print('hi')\nX = 1\n"), ("pkg/util.py", b"")]
    assert _hash(worker_files=moved) != _hash()


def test_the_tag_carries_sixteen_hex_digits_of_the_hash() -> None:
    assert worker_tag(_hash()) == f"sandhold-worker:{_hash()[:16]}"


def test_worker_files_are_python_sources_by_relative_path_without_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "b.py").write_bytes(b"b")
    (tmp_path / "pkg" / "a.py").write_bytes(b"a")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.py").write_bytes(b"cache")
    (tmp_path / "notes.txt").write_bytes(b"not code")
    (tmp_path / "link.py").symlink_to(tmp_path / "b.py")
    assert worker_files(tmp_path) == [("b.py", b"b"), ("pkg/a.py", b"a")]
