"""Old name of :mod:`pipekit.pipes.sample_transforms` (pipes wrapping :mod:`pipekit.transforms`), kept importable.

``from pipekit.pipes.transforms import Augmenter`` goes on working; new code
imports from :mod:`pipekit.pipes.sample_transforms` (or from :mod:`pipekit.pipes`).
"""

from pipekit.pipes.sample_transforms import *  # noqa: F403
from pipekit.pipes.sample_transforms import __all__  # noqa: F401
