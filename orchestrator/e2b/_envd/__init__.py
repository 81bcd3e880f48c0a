"""The envd protocol's generated stubs, copied unchanged from the ``e2b`` wheel (2.63.0, MIT
licence, (c) FoundryLabs, Inc.): ``process.Process`` and ``filesystem.Filesystem`` messages
(protobuf-py) and their Connect RPC service classes (connectrpc). They are the wire contract
the SDK's clients speak; this server implements the service protocols they declare, so a
field the SDK sends is named exactly as it expects. Regenerate by copying the files of a newer
wheel (``e2b/envd/{process,filesystem}/*.py``), never by editing them."""
