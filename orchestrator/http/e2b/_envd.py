"""The envd wire contract, taken from the E2B SDK's own wheel rather than copied: the messages
of ``process.Process`` and ``filesystem.Filesystem`` and their Connect service classes, as the
SDK's clients speak them. This server implements the service protocols those classes declare,
so every field is named exactly as the SDK sends it, and a newer pin of the ``e2b`` extra brings
the contract it was generated for."""

from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.envd.process import process_connect, process_pb

__all__ = ["filesystem_connect", "filesystem_pb", "process_connect", "process_pb"]
