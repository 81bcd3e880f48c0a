"""The MCP interface: the tools over stdio (``sandhold mcp``) and streamable HTTP (``/mcp``), and
the stdio front that forwards to a running ``sandhold serve`` (``sandhold mcp --connect``).

Deliberately empty: ``sandhold mcp`` imports ``handshake`` before the MCP SDK, so nothing here may
import ``server`` on the way (see ``handshake``). Import the modules themselves."""

__all__: list[str] = []
