"""pipekit: composable, resumable DataPipes for PyTorch training data.

Importing pipekit registers every functional pipe name, so chains such as
``IterableWrapper(["data/"]).list_files_by_fsspec().open_files_by_fsspec().decode_image()``
work, and exposes :class:`DataLoader`, a resumable loader with sensible defaults, and
torchdata's :class:`DataLoader2` with its reading services, built on it.

:mod:`pipekit.geo` (geospatial rasters, needing the ``geo`` extra:
``pip install "pipekit[geo]"``) is imported on first use of ``pipekit.geo``,
so ``import pipekit`` stays lean for pipelines that read no rasters.
"""

from typing import TYPE_CHECKING, Any

from pipekit import adapters, datasets, errors, pipes, transforms
from pipekit._loader import DataLoader
from pipekit._optional import lazy_attributes
from pipekit.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)

# torchdata's namespaces, ``import pipekit.pipes as dp; dp.iter.FileLister(...)``: importing the
# submodules sets them as pipekit.pipes.iter and pipekit.pipes.map.
from pipekit.pipes import iter as _iter_namespace
from pipekit.pipes import map as _map_namespace

del _iter_namespace, _map_namespace

if TYPE_CHECKING:  # imported on first use of ``pipekit.geo`` (see __getattr__ below)
    from pipekit import geo

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

_getattr, _dir = lazy_attributes(__name__, {"geo": "pipekit.geo"}, globals())


def __getattr__(name: str) -> Any:
    """Import :mod:`pipekit.geo` (the geo extra's packages) on first use."""
    return _getattr(name)


def __dir__() -> list[str]:
    return _dir()
