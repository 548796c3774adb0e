"""Old name of :mod:`pipekit.pipes.mapping` (pipes that apply a user function), kept importable.

``from pipekit.pipes.transform import FlatMapper`` goes on working; new code
imports from :mod:`pipekit.pipes.mapping` (or from :mod:`pipekit.pipes`).
"""

from pipekit.pipes.mapping import *  # noqa: F403
from pipekit.pipes.mapping import __all__  # noqa: F401
