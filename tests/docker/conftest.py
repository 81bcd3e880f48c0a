"""Fixtures every Docker-backed module may ask for."""

from tests.docker.gvisor import runsc_works

__all__ = ["runsc_works"]
