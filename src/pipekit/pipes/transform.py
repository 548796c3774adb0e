"""Old name of :mod:`pipekit.pipes.mapping` (pipes that apply a user function), kept importable.

``from pipekit.pipes.transform import FlatMapper`` goes on working; new code
imports from :mod:`pipekit.pipes.mapping` (or from :mod:`pipekit.pipes`).
"""

from __future__ import annotations

from typing import Any

from pipekit.pipes._torch import pickle_state
from pipekit.pipes.mapping import *  # noqa: F403
from pipekit.pipes.mapping import __all__  # noqa: F401
from pipekit.pipes.state import draw_seed

# --------------------------------------------------------------------------------------------------
# Deprecated, private: only pipes/combine.py still imports these two, until its pipes are rebuilt on
# pipekit.pipes.state (ResumablePipe, SeededPipe, draw_seed).  Delete them then; do not use them.

_torch_seed = draw_seed


class _Resumable:
    """The resume bookkeeping pipekit's pipes had before :class:`pipekit.pipes.state.ResumablePipe`.

    ``load_state_dict`` keeps the state pending until the next iterator starts;
    ``state_dict`` returns the pending state if no iterator has consumed it yet.
    Runtime attributes (named in ``_runtime``) are left out of pickles.
    """

    _runtime: tuple[str, ...] = ()
    _restore: dict[str, Any] | None = None

    def _take_restore(self) -> dict[str, Any] | None:
        state, self._restore = self._restore, None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict expects a dict, got {type(state).__name__}")
        self._restore = state

    def __getstate__(self) -> Any:
        return pickle_state({k: v for k, v in self.__dict__.items() if k not in self._runtime})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def _init_runtime(self) -> None:  # pragma: no cover - overridden
        pass
