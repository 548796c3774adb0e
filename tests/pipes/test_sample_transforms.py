"""append_index, normalize, augment and augment_batch (pipekit.pipes._sample_transforms)."""

from __future__ import annotations

import logging
import pickle

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import pipekit
from pipekit.pipes import IterableWrapper
from pipekit.pipes._resume import not_snapshot_capable, restore_pipeline, snapshot_pipeline
from pipekit.pipes._sample_transforms import Augmenter, BatchAugmenter, IndexAppender, Normalizer
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes
from pipekit.transforms import (
    AppendNDVI,
    Augment,
    BatchCompose,
    BatchRandomCrop,
    BatchRandomHorizontalFlip,
    BatchRandomRot90,
    Normalize,
    RandomBrightness,
    RandomRot90,
    compute_stats,
)

LANDSAT8 = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")


def make_samples(n: int = 10, bands: int = 7, size: int = 8) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "image": torch.randint(1, 10000, (bands, size, size), generator=g).to(torch.int16),
            "mask": torch.randint(0, 3, (size, size), generator=g),
            "id": i,
        }
        for i in range(n)
    ]


def as_lists(sample: dict) -> tuple:
    """Comparable form of a sample (tensors as nested lists)."""
    return tuple((k, v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in sorted(sample.items()))


def to_float(sample: dict) -> dict:
    return {**sample, "image": sample["image"].float() / 10000}


def stack(batch: list[dict]) -> dict:
    return {"image": torch.stack([s["image"] for s in batch]), "mask": torch.stack([s["mask"] for s in batch])}


def augment_pipe(n: int = 10):
    ops = [v2.RandomHorizontalFlip(), RandomRot90(), RandomBrightness(0.3, per_band=True)]
    return IterableWrapper(make_samples(n)).map(to_float).augment(ops).set_seed(3).map(as_lists)


def augment_batch_pipe(n: int = 16):
    ops = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90(), BatchRandomCrop(5)])
    return IterableWrapper(make_samples(n)).batch(4).map(stack).augment_batch(ops).set_seed(5).map(as_lists)


def test_functional_names_are_registered():
    assert owner_of("append_index") == "pipekit.pipes._sample_transforms.IndexAppender"
    assert owner_of("normalize") == "pipekit.pipes._sample_transforms.Normalizer"
    assert owner_of("augment") == "pipekit.pipes._sample_transforms.Augmenter"
    assert owner_of("augment_batch") == "pipekit.pipes._sample_transforms.BatchAugmenter"


class TestIndexAppender:
    def test_appends_like_the_transform(self):
        samples = make_samples(4)
        pipe = IterableWrapper(samples).append_index("ndvi", nir="SR_B5", red="SR_B4", bands=LANDSAT8)
        expected = [AppendNDVI(4, 3)(s) for s in samples]
        out = list(pipe)
        assert [s["image"].shape for s in out] == [torch.Size([8, 8, 8])] * 4
        for got, want in zip(out, expected):
            assert torch.equal(got["image"], want["image"]) and got["id"] == want["id"]
        assert len(pipe) == 4
        assert isinstance(pipe, IndexAppender) and pipe.stateless is True

    def test_takes_a_ready_transform_and_works_with_map(self):
        samples = make_samples(3)
        t = AppendNDVI(index_nir=4, index_red=3)
        a = [s["image"] for s in IterableWrapper(samples).append_index(t)]
        b = [s["image"] for s in IterableWrapper(samples).map(t)]
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        with pytest.raises(TypeError, match="got an AppendIndex and extra arguments"):
            IterableWrapper(samples).append_index(t, nir=1)

    def test_errors_say_which_stage(self):
        pipe = IterableWrapper(make_samples(2)).append_index("ndvi", nir=9, red=3)
        with pytest.raises(IndexError, match="band nir=9 is out of range for an image with 7 bands") as info:
            list(pipe)
        assert any("in append_index" in n for n in getattr(info.value, "__notes__", ["in append_index"]))

    def test_pickles_before_iteration(self):
        pipe = IterableWrapper(make_samples(3)).append_index("ndvi", nir=4, red=3)
        copy = pickle.loads(pickle.dumps(pipe))
        assert [as_lists(s) for s in copy] == [as_lists(s) for s in pipe]

    def test_resumes(self):
        def make():
            return IterableWrapper(make_samples(6)).append_index("ndvi", nir=4, red=3).map(as_lists)

        assert not_snapshot_capable(make()) == []
        for n in (0, 3, 5):
            assert_resumes(make, n)


class TestNormalizer:
    def test_normalizes_with_stats(self):
        samples = make_samples(6)
        stats = compute_stats(samples, progress=False)
        out = list(IterableWrapper(samples).normalize(stats.mean, stats.std))
        allpix = torch.cat([s["image"].reshape(7, -1) for s in out], dim=1).double()
        torch.testing.assert_close(allpix.mean(1), torch.zeros(7, dtype=torch.float64), atol=1e-5, rtol=0)
        assert out[0]["image"].dtype == torch.float32 and out[0]["id"] == 0
        same = list(IterableWrapper(samples).normalize(stats.normalize()))
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(out, same))

    def test_arguments(self):
        src = IterableWrapper(make_samples(1))
        with pytest.raises(TypeError, match="std is required"):
            src.normalize([1.0] * 7)
        with pytest.raises(TypeError, match="either a Normalize or mean/std"):
            src.normalize(Normalize(0, 1), 1.0)
        pipe = src.normalize(0.0, 2.0, dtype=torch.float16)
        assert next(iter(pipe))["image"].dtype == torch.float16
        assert isinstance(pipe, Normalizer) and len(pipe) == 1

    def test_pickles_and_resumes(self):
        def make():
            return IterableWrapper(make_samples(5)).normalize([5000.0] * 7, [3000.0] * 7).map(as_lists)

        assert [*pickle.loads(pickle.dumps(make()))] == [*make()]
        for n in (0, 2, 4):
            assert_resumes(make, n)


class TestAugmenter:
    def test_seeded_epochs_repeat_and_change_with_the_seed(self):
        a, b = list(augment_pipe()), list(augment_pipe())
        assert a == b
        other = list(
            IterableWrapper(make_samples()).map(to_float).augment([RandomBrightness(0.3)]).set_seed(4).map(as_lists)
        )
        first = list(
            IterableWrapper(make_samples()).map(to_float).augment([RandomBrightness(0.3)]).set_seed(3).map(as_lists)
        )
        assert other != first

    def test_unseeded_epochs_differ(self):
        pipe = IterableWrapper(make_samples(3)).map(to_float).augment([RandomBrightness(0.5)]).map(as_lists)
        assert list(pipe) != list(pipe)

    def test_moves_image_and_mask_together(self):
        samples = [to_float(s) for s in make_samples(6)]
        pipe = IterableWrapper(samples).augment([RandomRot90(), v2.RandomHorizontalFlip()]).set_seed(0)
        for src, out in zip(samples, pipe):
            matches = [
                (k, f)
                for k in range(4)
                for f in (False, True)
                if torch.equal(out["image"], _rot_flip(src["image"], k, f))
                and torch.equal(out["mask"], _rot_flip(src["mask"], k, f))
            ]
            assert matches and out["id"] == src["id"]

    def test_takes_a_ready_augment(self):
        aug = Augment([RandomBrightness(0.2)], seed=1)
        pipe = IterableWrapper(make_samples(2)).map(to_float).augment(aug)
        assert isinstance(pipe, Augmenter) and pipe.transform is aug and len(pipe) == 2
        with pytest.raises(TypeError, match="pass the keys to the Augment"):
            IterableWrapper([]).augment(aug, image_key="x")

    def test_pickles_before_iteration(self):
        pipe = augment_pipe()
        copy = pickle.loads(pickle.dumps(pipe))
        assert list(copy) == list(augment_pipe())

    def test_resumes_exactly(self):
        assert not_snapshot_capable(augment_pipe()) == []
        for n in (0, 1, 5, 9):
            assert_resumes(augment_pipe, n)

    @pytest.mark.parametrize("state", [{"rng": None}, {"seed": None, "rng": None}])
    def test_a_state_taken_before_the_first_epoch_starts_one(self, state):
        assert augment_pipe().datapipe.state_dict() == {"seed": None, "rng": None}
        fresh = augment_pipe()
        fresh.datapipe.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert fresh.datapipe.state_dict() == state  # pending until the next iterator starts
        assert list(fresh) == list(augment_pipe())  # seeded from its pending seed, as an epoch's start

    def test_restores_a_checkpoint_without_epoch_seed(self):
        # checkpoints written before the pipe was a SeededPipe hold the stream's position but no "seed"
        pipe = augment_pipe()
        it = iter(pipe)
        head = [next(it) for _ in range(4)]
        state = snapshot_pipeline(pipe)
        own = state["states"][1]
        assert set(own) == {"seed", "rng"} and own["rng"] is not None
        del own["seed"]
        fresh = augment_pipe()
        restore_pipeline(fresh, pickle.loads(pickle.dumps(state)))
        assert head + list(fresh) == list(augment_pipe())

    def test_errors_say_which_stage(self):
        pipe = IterableWrapper([{"mask": torch.zeros(2, 2)}]).augment([RandomRot90()])
        with pytest.raises(KeyError, match="has no 'image' entry") as info:
            list(pipe)
        assert any("in augment" in n for n in getattr(info.value, "__notes__", ["in augment"]))

    def test_dataloader_workers_differ_and_seeded_runs_repeat(self):
        def run(seed):
            # no sharding: both workers see the same samples, so equal outputs would mean equal streams
            pipe = IterableWrapper(make_samples(4)).map(to_float).augment([RandomBrightness(0.5, per_band=True)])
            loader = DataLoader(
                pipe,
                batch_size=None,
                num_workers=2,
                generator=torch.Generator().manual_seed(seed),
                multiprocessing_context="fork",
            )
            return [s["image"] for s in loader]

        a, b, c = run(0), run(0), run(1)
        assert len(a) == 8  # 4 samples from each of the 2 workers, interleaved
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))
        assert not torch.equal(a[0], a[1])  # sample 0 in worker 0 and in worker 1

    def test_resumes_through_pipekit_dataloader(self, caplog):
        def make():
            ops = [v2.RandomVerticalFlip(), RandomBrightness(0.3)]
            return (
                IterableWrapper(make_samples(12)).shuffle().sharding_filter().map(to_float).augment(ops).map(as_lists)
            )

        caplog.set_level(logging.INFO, logger="pipekit")
        torch.manual_seed(0)
        loader = pipekit.DataLoader(make())
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make())
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert len(head + rest) == 12
        assert "replay" not in caplog.text


def _rot_flip(x: torch.Tensor, k: int, flip: bool) -> torch.Tensor:
    x = torch.rot90(x, k, dims=(-2, -1))
    return x.flip(-1) if flip else x


class TestBatchAugmenter:
    def test_crops_each_batch(self):
        out = list(augment_batch_pipe())
        assert len(out) == 4
        image = dict(out[0])["image"]
        assert torch.tensor(image).shape == (4, 7, 5, 5)
        assert out == list(augment_batch_pipe())

    def test_requires_a_batch_transform(self):
        with pytest.raises(TypeError, match=r"must be a pipekit\.transforms\.BatchTransform"):
            IterableWrapper([]).augment_batch(Normalize(0, 1))

    def test_pickles_and_resumes(self):
        assert list(pickle.loads(pickle.dumps(augment_batch_pipe()))) == list(augment_batch_pipe())
        pipe = augment_batch_pipe()
        assert isinstance(pipe.datapipe, BatchAugmenter) and len(pipe) == 4
        for n in (0, 1, 3):
            assert_resumes(augment_batch_pipe, n)
