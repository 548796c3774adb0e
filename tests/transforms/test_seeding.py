"""Per-worker, per-rank random streams (pipekit.transforms.seeding), with real DataLoader workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipekit.transforms import seeding
from pipekit.transforms.seeding import RandomStream, mix_seed, pipe_stream_seed, stream_seed


class DrawDataset(Dataset):
    """Each item: (index, worker id, a torch draw and a numpy draw from the stream)."""

    def __init__(self, stream: RandomStream, n: int = 8) -> None:
        self.stream = stream
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        with self.stream.torch_global():
            t = float(torch.rand(()))
        return i, (info.id if info else -1), t, float(self.stream.numpy().random())


def draws(stream: RandomStream, seed: int, workers: int = 2, epochs: int = 1):
    ds = DrawDataset(stream)
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context="fork" if workers else None,
        persistent_workers=False,
    )
    return [list(loader) for _ in range(epochs)]


class TestMixSeed:
    def test_deterministic_and_sensitive(self):
        assert mix_seed(1, 2, 3) == mix_seed(1, 2, 3)
        assert len({mix_seed(1, 2, 3), mix_seed(1, 2, 4), mix_seed(3, 2, 1), mix_seed(1, 2)}) == 4
        assert 0 <= mix_seed(-1, 2**70) < 2**63


class TestRandomStream:
    def test_same_seed_same_stream(self):
        a, b, c = RandomStream(5), RandomStream(5), RandomStream(6)
        with a.torch_global():
            x = torch.rand(4)
        with b.torch_global():
            y = torch.rand(4)
        with c.torch_global():
            z = torch.rand(4)
        assert torch.equal(x, y) and not torch.equal(x, z)
        assert a.numpy().random() == b.numpy().random() != c.numpy().random()

    def test_does_not_disturb_the_global_rng(self):
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        s = RandomStream(0)
        with s.torch_global():
            torch.rand(100)
        assert torch.equal(torch.rand(3), expected)

    def test_stream_continues_across_calls(self):
        a, b = RandomStream(1), RandomStream(1)
        with a.torch_global():
            first = torch.rand(2)
        with a.torch_global():
            second = torch.rand(2)
        with b.torch_global():
            both = torch.rand(4)
        assert torch.equal(torch.cat([first, second]), both)

    def test_unseeded_streams_follow_torch_manual_seed_and_differ(self):
        torch.manual_seed(0)
        a, b = RandomStream(), RandomStream()
        va, vb = a.numpy().random(), b.numpy().random()
        assert va != vb  # different salts
        torch.manual_seed(0)
        a2, b2 = RandomStream(), RandomStream()
        assert (a2.numpy().random(), b2.numpy().random()) == (va, vb)

    def test_pickled_copy_starts_over(self):
        a = RandomStream(9)
        first = a.numpy().random()
        copy = pickle.loads(pickle.dumps(a))
        assert copy.numpy().random() == first

    def test_state_dict_resumes_exactly(self):
        a = RandomStream(3)
        a.numpy().random()
        with a.torch_global():
            torch.rand(5)
        state = pickle.loads(pickle.dumps(a.state_dict()))
        with a.torch_global():
            expected_t = torch.rand(3)
        expected_n = a.numpy().random(3)
        b = RandomStream(77)
        b.load_state_dict(state)
        with b.torch_global():
            assert torch.equal(torch.rand(3), expected_t)
        assert np.array_equal(b.numpy().random(3), expected_n)

    def test_generator_and_torch_global_draw_one_sequence(self):
        a, b = RandomStream(2), RandomStream(2)
        with a.torch_global():
            x = torch.rand(3)
        y = torch.rand(2, generator=a.generator())
        with a.torch_global():
            z = torch.randint(0, 1000, (4,))
        with b.torch_global():
            expected = torch.rand(5), torch.randint(0, 1000, (4,))
        assert torch.equal(torch.cat([x, y]), expected[0]) and torch.equal(z, expected[1])
        state = b.state_dict()
        assert torch.equal(state["torch"], a.state_dict()["torch"])
        c = RandomStream(0)
        c.load_state_dict(state)
        assert torch.equal(torch.rand(4, generator=c.generator()), torch.rand(4, generator=b.generator()))

    def test_torch_global_restores_the_global_rng_after_an_error(self):
        torch.manual_seed(1)
        expected = torch.rand(2)
        torch.manual_seed(1)
        s = RandomStream(0)

        def fail() -> None:
            with s.torch_global():
                torch.rand(10)
                raise KeyError("boom")

        with pytest.raises(KeyError):
            fail()
        assert torch.equal(torch.rand(2), expected)
        with s.torch_global():  # the stream moved on by the 10 numbers drawn before the error
            after = torch.rand(1)
        fresh = RandomStream(0)
        assert torch.equal(torch.rand(11, generator=fresh.generator())[10:], after)

    def test_rank_changes_the_stream(self, monkeypatch):
        monkeypatch.setenv("RANK", "0")
        s0 = stream_seed(seed=4, salt=1)
        monkeypatch.setenv("RANK", "1")
        s1 = stream_seed(seed=4, salt=1)
        assert s0 != s1 and seeding.get_rank() == 1
        p1 = pipe_stream_seed(7)
        monkeypatch.setenv("RANK", "0")
        assert pipe_stream_seed(7) != p1
        assert pipe_stream_seed(7) == pipe_stream_seed(7)

    def test_bad_seed(self):
        with pytest.raises(TypeError, match="seed must be an int"):
            RandomStream("1")


class TestDataLoaderWorkers:
    def test_workers_differ_and_seeded_runs_repeat(self):
        stream = RandomStream()
        (run1,) = draws(stream, seed=0)
        (run2,) = draws(stream, seed=0)
        (other,) = draws(stream, seed=1)
        assert run1 == run2
        assert [r[2] for r in run1] != [r[2] for r in other]
        by_worker = {w: [r[2:] for r in run1 if r[1] == w] for w in (0, 1)}
        assert len(by_worker[0]) == len(by_worker[1]) == 4
        assert by_worker[0] != by_worker[1]  # workers do not repeat each other
        assert len({r[2] for r in run1}) == 8 and len({r[3] for r in run1}) == 8

    def test_a_stream_used_before_forking_is_not_shared(self):
        stream = RandomStream(seed=5)
        stream.numpy().random()  # seeded in the main process, then forked into workers
        (run,) = draws(stream, seed=0)
        firsts = [r[3] for r in run if r[0] in (0, 1)]  # the first item of each worker
        assert firsts[0] != firsts[1]

    def test_epochs_differ(self):
        stream = RandomStream(seed=1)
        e1, e2 = draws(stream, seed=0, epochs=2)
        assert [r[2] for r in e1] != [r[2] for r in e2]

    def test_main_process_loader(self):
        torch.manual_seed(0)
        (a,) = draws(RandomStream(seed=3), seed=0, workers=0)
        (b,) = draws(RandomStream(seed=3), seed=0, workers=0)
        assert a == b
