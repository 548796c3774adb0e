"""pipekit: composable, resumable DataPipes for PyTorch training data.

Importing pipekit registers every functional pipe name, so chains such as
``IterableWrapper(["data/"]).list_files_by_fsspec().open_files_by_fsspec().decode_image()``
work, and exposes :class:`DataLoader`, a resumable loader with sensible defaults, and
torchdata's :class:`DataLoader2` with its reading services, built on it.
"""

from pipekit import adapters, datasets, errors, geo, pipes, transforms
from pipekit.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from pipekit.loader import DataLoader

# torchdata's namespaces, ``import pipekit.pipes as dp; dp.iter.FileLister(...)``: importing the
# submodules sets them as pipekit.pipes.iter and pipekit.pipes.map.
from pipekit.pipes import iter as _iter_namespace
from pipekit.pipes import map as _map_namespace

del _iter_namespace, _map_namespace

__version__ = "0.1.0"

__all__ = [
    "DataLoader",
    "DataLoader2",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "SequentialReadingService",
    "__version__",
    "adapters",
    "datasets",
    "errors",
    "geo",
    "pipes",
    "transforms",
]
