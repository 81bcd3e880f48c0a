"""The worker's settings: one JSON object in the environment variable ``SANDHOLD_WORKER_CONFIG``,
read once at start. Every key is required and unknown keys are refused, so a host and a worker
that disagree find out at once instead of running under a policy neither meant."""

import json
import re
from typing import Any

CONFIG_ENV = "SANDHOLD_WORKER_CONFIG"
MODES = ("restricted", "unrestricted")
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_BUILTIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Larger than any sane limit; a bigger number is a bug on the host side.
_MAX_LIMIT = 1 << 30
_LISTS = {
    "allowed_modules": _MODULE_NAME,
    "forbidden_modules": _MODULE_NAME,
    "forbidden_builtins": _BUILTIN_NAME,
}
_LIMITS = (
    "max_code_bytes",
    "max_stream_bytes",
    "max_reply_bytes",
    "max_repr_chars",
    "max_result_bytes",
)
# Room for the largest reply with every field cut down (an error naming a 64-character id).
MIN_REPLY_BYTES = 4096


class ConfigError(ValueError):
    """The configuration is missing or invalid; the worker cannot start."""


class WorkerConfig:
    """The parsed settings. A plain class, as are the worker's other records: importing
    dataclasses (it pulls in inspect, dis and tokenize) was the largest cost of the worker's
    start before its ready frame, which every cold session waits for."""

    __slots__ = (
        "allowed_modules",
        "forbidden_builtins",
        "forbidden_modules",
        "max_code_bytes",
        "max_reply_bytes",
        "max_repr_chars",
        "max_result_bytes",
        "max_stream_bytes",
        "mode",
        "persist",
    )

    def __init__(
        self,
        *,
        mode: str,
        allowed_modules: frozenset[str],
        forbidden_modules: frozenset[str],
        forbidden_builtins: frozenset[str],
        max_code_bytes: int,
        max_stream_bytes: int,
        max_reply_bytes: int,
        max_repr_chars: int,
        max_result_bytes: int,
        persist: bool,
    ) -> None:
        self.mode = mode
        self.allowed_modules = allowed_modules
        self.forbidden_modules = forbidden_modules
        self.forbidden_builtins = forbidden_builtins
        self.max_code_bytes = max_code_bytes
        self.max_stream_bytes = max_stream_bytes
        self.max_reply_bytes = max_reply_bytes
        self.max_repr_chars = max_repr_chars
        # Bytes all of a cell's rich results may take together (display.py).
        self.max_result_bytes = max_result_bytes
        # Outlive the host's stream: on its end, wait for a relay on socket_path(pid) (see
        # relay.py).
        self.persist = persist

    @property
    def restricted(self) -> bool:
        return self.mode == "restricted"


def parse_config(text: str | None) -> WorkerConfig:
    if not text:
        raise ConfigError(f"{CONFIG_ENV} is not set")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{CONFIG_ENV} must be a JSON object")
    expected = {"mode", "persist", *_LISTS, *_LIMITS}
    missing, unknown = expected - raw.keys(), raw.keys() - expected
    if missing or unknown:
        raise ConfigError(
            f"{CONFIG_ENV}: missing keys {sorted(missing)}, unknown {sorted(unknown)}"
        )
    if raw["mode"] not in MODES:
        raise ConfigError(f"{CONFIG_ENV}: mode must be one of {MODES}")
    if not isinstance(raw["persist"], bool):
        raise ConfigError(f"{CONFIG_ENV}: persist must be true or false")
    lists = {key: _names(raw, key, pattern) for key, pattern in _LISTS.items()}
    limits = {key: _limit(raw, key) for key in _LIMITS}
    if limits["max_reply_bytes"] < MIN_REPLY_BYTES:
        raise ConfigError(f"{CONFIG_ENV}: max_reply_bytes must be at least {MIN_REPLY_BYTES}")
    return WorkerConfig(
        mode=raw["mode"],
        allowed_modules=lists["allowed_modules"],
        forbidden_modules=lists["forbidden_modules"],
        forbidden_builtins=lists["forbidden_builtins"],
        max_code_bytes=limits["max_code_bytes"],
        max_stream_bytes=limits["max_stream_bytes"],
        max_reply_bytes=limits["max_reply_bytes"],
        max_repr_chars=limits["max_repr_chars"],
        max_result_bytes=limits["max_result_bytes"],
        persist=raw["persist"],
    )


def _names(raw: dict[str, Any], key: str, pattern: re.Pattern[str]) -> frozenset[str]:
    value = raw[key]
    if not isinstance(value, list) or not all(
        isinstance(item, str) and pattern.match(item) for item in value
    ):
        raise ConfigError(f"{CONFIG_ENV}: {key} must be a list of names")
    return frozenset(value)


def _limit(raw: dict[str, Any], key: str) -> int:
    value = raw[key]
    if type(value) is not int or not 1 <= value <= _MAX_LIMIT:
        raise ConfigError(f"{CONFIG_ENV}: {key} must be an integer in 1..{_MAX_LIMIT}")
    return value
