"""Container backends: what the layers above need from an engine (``base``) and the engines."""

__all__ = []
