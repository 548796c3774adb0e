"""``wds.WebLoader``: ``pipekit.DataLoader`` with the fluid methods, applied in the main process.

``WebLoader(dataset, num_workers=2).unbatched().shuffle(1000).batched(64)`` re-batches what the workers send,
as the library's does; ``state_dict()`` holds the loader's checkpoint and the positions of those main-process
stages (the shuffle buffer's items included), so ``load_state_dict()`` resumes exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipekit._loader import DataLoader
from pipekit.pipes._resume import not_snapshot_capable, prepare_for_resume, restore_pipeline, snapshot_pipeline
from pipekit.pipes.state import ResumablePipe
from pipekit.webdataset._fluid import FluidInterface, _apply

__all__ = ["WebLoader"]


class LoaderSource(ResumablePipe):
    """The batches of a DataLoader, as the source of the main-process stages.

    Resume: the loader's state, and whether this pass had already read the loader's whole epoch (a
    main-process shuffle buffer can hold all of it): then the restored pass yields nothing more from the
    loader, whose state has become the next epoch's start.
    """

    state_keys = ("loader", "done")
    #: a shuffle after it keeps its buffer inline: restoring the loader to an older position to re-read it
    #: would restart the loader's workers and epoch, not replay the same batches
    replayable = False

    def __init__(self, loader: DataLoader) -> None:
        super().__init__()
        self.loader = loader
        self._done = False
        self._skip = False

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict(), "done": self._done}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._done = False
        self._skip = state is not None and bool(state["done"])
        if state is not None:
            self.loader.load_state_dict(state["loader"])

    def __iter__(self) -> Iterator[Any]:
        if self._skip:  # the checkpointed pass had read the whole epoch already
            self._skip, self._done = False, True
            return
        yield from self.loader
        self._done = True


class _EpochCut:
    """``with_epoch(n)`` on a loader: the loader's batches over and over, ``n`` per epoch."""

    is_pipe_stage = True

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, pipe: Any) -> Any:
        return pipe.cycle().header(self.n)


class WebLoader(FluidInterface):
    """``wds.WebLoader(dataset, batch_size=None, num_workers=...)``: a resumable loader with the fluid methods.

    Takes :class:`pipekit.DataLoader`'s arguments (``batch_size`` defaults to ``None`` for pipes, which batch
    themselves).  Without fluid stages it iterates the loader itself.

    Example:
        >>> import pipekit.webdataset as wds
        >>> ds = wds.FluidWrapper([(i, i * i) for i in range(6)]).batched(2)
        >>> loader = wds.WebLoader(ds).unbatched().batched(3)
        >>> [[a.tolist(), b.tolist()] for a, b in loader]
        [[[0, 1, 2], [0, 1, 4]], [[3, 4, 5], [9, 16, 25]]]
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        self.loader = DataLoader(dataset, *args, **kwargs)
        self.stages: list[Any] = []
        self.length: int | None = None
        self._pending: dict[str, Any] | None = None
        self._pipe: Any = None

    def compose(self, *stages: Any) -> WebLoader:
        """A loader sharing this one's DataLoader, with ``stages`` appended."""
        new = WebLoader.__new__(WebLoader)
        new.__dict__.update(self.__dict__)
        new.stages = [*self.stages, *stages]
        new._pipe = None
        return new

    def with_epoch(self, n: int) -> WebLoader:
        """Epochs of ``n`` batches (the loader's batches over and over), on every rank alike."""
        return self.compose(_EpochCut(n))

    def with_length(self, n: int, silent: bool = False) -> WebLoader:
        """Report ``len() == n``."""
        new = self.compose()
        new.length = n
        return new

    def __len__(self) -> int:
        if self.length is not None:
            return self.length
        if not self.stages:
            return len(self.loader)
        raise TypeError("WebLoader has no length: set one with .with_length(n)")

    def _build(self) -> Any:
        pipe: Any = LoaderSource(self.loader)
        for stage in self.stages:
            pipe = _apply(stage, pipe)
        return prepare_for_resume(pipe)

    def __iter__(self) -> Iterator[Any]:
        if not self.stages:
            return iter(self.loader)
        if self._pipe is None:
            self._pipe = self._build()
        if self._pending is not None:
            restore_pipeline(self._pipe, self._pending)
            self._pending = None
        return iter(self._pipe)

    def state_dict(self) -> dict[str, Any]:
        """The loader's checkpoint, with the positions of the main-process stages."""
        if not self.stages:
            return {"loader": self.loader.state_dict()}
        if self._pending is not None:
            return {"stages": self._pending}
        pipe = self._pipe if self._pipe is not None else self._build()
        state = snapshot_pipeline(pipe)
        if state is None:
            raise ValueError(
                f"WebLoader: the main-process stages {not_snapshot_capable(pipe)} cannot be checkpointed "
                "(a generator function stage): use the library's filters (wds.map, wds.select...) there"
            )
        return {"stages": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`'s checkpoint at the next ``iter()``."""
        if "loader" in state:
            self.loader.load_state_dict(state["loader"])
        else:
            self._pipe = self._build()
            self._pending = state["stages"]

    def skip_report(self) -> Any:
        """The loader's :meth:`pipekit.DataLoader.skip_report`."""
        return self.loader.skip_report()

    def shutdown(self) -> None:
        """Stop the loader's workers."""
        shutdown = getattr(self.loader, "shutdown", None)
        if callable(shutdown):
            shutdown()
