"""The DataPipe base module: functional-name registration and the resume protocol."""

from __future__ import annotations

import pytest

import pipekit
from pipekit.errors import FunctionalNameError
from pipekit.pipes import IterableWrapper
from pipekit.pipes.base import IterDataPipe, MapDataPipe, Resumable, functional_datapipe, owner_of, registered_names


class TestFunctionalDatapipe:
    def test_registers_a_chainable_name(self):
        @functional_datapipe("pipekit_test_double")
        class Doubler(IterDataPipe):
            def __init__(self, source):
                self.source = source

            def __iter__(self):
                for x in self.source:
                    yield 2 * x

        try:
            assert list(IterableWrapper([1, 2, 3]).pipekit_test_double()) == [2, 4, 6]
            assert owner_of("pipekit_test_double") == f"{Doubler.__module__}.{Doubler.__qualname__}"
            assert Doubler.functional_name == "pipekit_test_double"
        finally:
            del IterDataPipe.functions["pipekit_test_double"]

    def test_taken_name_names_both_owners(self):
        with pytest.raises(FunctionalNameError) as info:

            @functional_datapipe("map")
            class MyMapper(IterDataPipe):
                def __iter__(self):
                    yield from ()

        message = str(info.value)
        assert "'map'" in message
        assert "MapperIterDataPipe" in message  # torch's owner
        assert "MyMapper" in message  # the newcomer

    def test_map_names_are_checked_too(self):
        with pytest.raises(FunctionalNameError, match="MapDataPipe functional name 'map'"):

            @functional_datapipe("map")
            class MyMapMapper(MapDataPipe):
                def __getitem__(self, i):
                    return i

                def __len__(self):
                    return 0

    def test_rejects_non_pipes_and_bad_names(self):
        with pytest.raises(TypeError, match="IterDataPipe or MapDataPipe"):
            functional_datapipe("pipekit_test_not_a_pipe")(int)
        with pytest.raises(ValueError, match="identifier"):
            functional_datapipe("not a name")

    def test_reregistering_the_same_class_is_allowed(self):
        """A module reload re-registers classes with the same dotted name: not a clash."""

        def define():
            @functional_datapipe("pipekit_test_reload")
            class Reloaded(IterDataPipe):
                def __init__(self, source):
                    self.source = source

                def __iter__(self):
                    yield 1

            return Reloaded

        try:
            first, second = define(), define()
            assert first is not second
            assert list(IterableWrapper([0]).pipekit_test_reload()) == [1]
        finally:
            del IterDataPipe.functions["pipekit_test_reload"]

    def test_importing_pipekit_registers_names(self):
        names = set(registered_names("iter"))
        assert {"map", "filter", "shuffle", "batch", "sharding_filter"} <= names
        assert pipekit.pipes is not None


class TestReplacingTorchsNames:
    """``replaces=``: the explicit way to take over a name torch registered for its own pipe."""

    def test_a_subclass_replaces_torchs_class(self):
        import torch.utils.data.datapipes.iter as torch_iter

        saved = IterDataPipe.functions["concat"]
        try:

            @functional_datapipe("concat", replaces=torch_iter.Concater)
            class CheckedConcater(torch_iter.Concater):
                pass

            pipe = IterableWrapper([1]).concat(IterableWrapper([2]))
            assert type(pipe) is CheckedConcater and list(pipe) == [1, 2]
            assert owner_of("concat").endswith("CheckedConcater")
        finally:
            IterDataPipe.functions["concat"] = saved
        assert owner_of("concat").startswith("torch.")

    def test_refusals(self):
        import torch.utils.data.datapipes.iter as torch_iter

        with pytest.raises(FunctionalNameError, match="'concat' is already registered by torch"):

            @functional_datapipe("concat", replaces=torch_iter.Mapper)  # not the owner of "concat"
            class WrongOwner(torch_iter.Mapper):
                pass

        with pytest.raises(TypeError, match="must subclass the class it replaces"):

            @functional_datapipe("concat", replaces=torch_iter.Concater)
            class NotASubclass(IterDataPipe):
                pass

        with pytest.raises(TypeError, match="one of torch's own DataPipe classes"):
            functional_datapipe("decode_image", replaces=IterableWrapper)
        assert owner_of("concat").startswith("torch.")

    def test_pipekits_checked_builtins_own_their_names(self):
        for name in ("batch", "shuffle", "unbatch", "sharding_filter"):
            assert owner_of(name).startswith("pipekit.pipes._builtin."), name


class TestResumableProtocol:
    def test_iterable_wrapper_is_resumable(self):
        assert isinstance(IterableWrapper([1]), Resumable)

    def test_plain_pipe_is_not(self):
        assert not isinstance(IterableWrapper([1]).map(abs), Resumable)


class TestCrossKindRegistration:
    def test_map_pipe_called_on_iter_pipes(self):
        seq = IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()
        assert isinstance(seq, MapDataPipe)
        assert seq["b"] == 2
        assert owner_of("to_map_datapipe", "iter").endswith("IterToMapConverter")
        assert owner_of("to_iter_datapipe", "map").endswith("MapToIterConverter")

    def test_bad_kind(self):
        with pytest.raises(ValueError, match="on must be"):
            functional_datapipe("pipekit_test_kind", on="both")


class TestResumableCheck:
    """``isinstance(x, Resumable)`` answers as typing's own protocol check (issue 12 made it cheap)."""

    def test_same_answers_as_a_plain_runtime_protocol(self) -> None:
        from typing import Protocol, runtime_checkable

        from pipekit.pipes import IterableWrapper
        from pipekit.pipes._builtin import ResumableShuffler
        from pipekit.pipes.base import Resumable

        @runtime_checkable
        class Plain(Protocol):
            def state_dict(self) -> dict: ...

            def load_state_dict(self, state: dict) -> None: ...

        class Both:
            def state_dict(self) -> dict:
                return {}

            def load_state_dict(self, state: dict) -> None:
                pass

        class Blocked:
            state_dict = None

            def load_state_dict(self, state: dict) -> None:
                pass

        class Bare:
            pass

        shadowed = Both()
        shadowed.state_dict = None  # type: ignore[method-assign]
        on_instance = Bare()
        on_instance.state_dict = dict  # type: ignore[attr-defined]
        on_instance.load_state_dict = print  # type: ignore[attr-defined]
        cases = [
            IterableWrapper([1]),
            IterableWrapper([1]).map(abs),
            IterableWrapper,
            ResumableShuffler,
            Both(),
            shadowed,
            Blocked(),
            Bare(),
            on_instance,
            3,
            None,
        ]
        assert [isinstance(x, Resumable) for x in cases] == [isinstance(x, Plain) for x in cases]
        assert [isinstance(x, Resumable) for x in cases[:2]] == [True, False]
