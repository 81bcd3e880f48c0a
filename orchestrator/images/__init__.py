"""Building the sandbox images without a registry: a base (given, pulled, or bootstrapped from
Debian packages) and the worker image on top of it, tagged by a hash of its inputs."""

from orchestrator.images.build import ImageBuildResult, ensure_worker_image
from orchestrator.images.progress import BuildProgress, NullProgress
from orchestrator.images.sources import AptSource, find_mirror
from orchestrator.images.worker import image_inputs_hash, worker_tag

__all__ = [
    "AptSource",
    "BuildProgress",
    "ImageBuildResult",
    "NullProgress",
    "ensure_worker_image",
    "find_mirror",
    "image_inputs_hash",
    "worker_tag",
]
