"""Tests for what the recipes share: ListSource, the standard transforms, the Recipe wrapper."""

from __future__ import annotations

import pickle

import pytest
import torch

import pipekit
from pipekit.datasets._recipe import ApplyToKey, ListSource, Recipe, check_positive_int, standard_image_transforms
from pipekit.pipes import IterableWrapper
from pipekit.testing import assert_resumes


class TestListSource:
    def test_unshuffled_keeps_the_order(self):
        assert list(ListSource(list("abcde"), shuffle=False)) == list("abcde")
        assert len(ListSource(list("abcde"))) == 5

    def test_shuffled_is_a_permutation_that_follows_the_seed(self):
        pipe = ListSource(list(range(50)))
        a = list(pipe.set_seed(1))
        b = list(pipe.set_seed(1))
        c = list(pipe.set_seed(2))
        assert sorted(a) == list(range(50))
        assert a == b
        assert a != c
        assert a != list(range(50))

    def test_without_a_seed_torch_decides_and_epochs_differ(self):
        pipe = ListSource(list(range(30)))
        torch.manual_seed(0)
        first, second = list(pipe), list(pipe)
        torch.manual_seed(0)
        assert list(pipe) == first
        assert first != second

    def test_set_shuffle_false_turns_it_off(self):
        assert list(ListSource(list(range(10))).set_shuffle(False)) == list(range(10))

    @pytest.mark.parametrize("n", [0, 1, 7, 19])
    def test_resumes_mid_epoch(self, n):
        assert_resumes(lambda: ListSource(list(range(20))).set_seed(3), n)

    def test_resumes_behind_a_shuffle_buffer(self):
        # the shuffle buffer is non-empty at the cut point
        assert_resumes(lambda: ListSource(list(range(40))).set_seed(5).shuffle(buffer_size=8).set_seed(6), 11)

    def test_checkpoint_is_small(self):
        pipe = ListSource(list(range(100_000))).set_seed(0)
        it = iter(pipe)
        next(it)
        assert pipe.state_dict()["yielded"] == 1
        assert len(pickle.dumps(pipe.state_dict())) < 100

    def test_shards_exactly_once_across_workers(self):
        pipe = ListSource(list(range(23))).sharding_filter()
        torch.manual_seed(0)
        seen = list(pipekit.DataLoader(pipe, num_workers=2))
        assert sorted(int(x) for x in seen) == list(range(23))

    def test_validation(self):
        with pytest.raises(TypeError, match="items must be a list"):
            ListSource("abc")
        with pytest.raises(TypeError, match="seed must be an int"):
            ListSource([1]).set_seed(1.5)
        with pytest.raises(ValueError, match="not a ListSource state"):
            ListSource([1]).load_state_dict({"yielded": 1})

    def test_pickles_before_iteration(self):
        pipe = ListSource(list(range(5)), shuffle=False)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(range(5))


class TestStandardImageTransforms:
    def test_train_ops_and_output(self):
        ops = standard_image_transforms(24, train=True, trivial_augment=True)
        assert [type(op).__name__ for op in ops] == ["RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide"]
        image = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
        for op in ops:
            image = op(image)
        assert image.shape == (3, 24, 24) and image.dtype == torch.uint8

    def test_eval_resizes_by_0_875_then_crops(self):
        ops = standard_image_transforms(224, train=False)
        assert ops[0].size == [256]
        image = torch.zeros(3, 300, 400, dtype=torch.uint8)
        for op in ops:
            image = op(image)
        assert image.shape == (3, 224, 224)

    def test_rectangular_size(self):
        ops = standard_image_transforms((16, 32), train=False)
        image = torch.zeros(3, 40, 80, dtype=torch.uint8)
        for op in ops:
            image = op(image)
        assert image.shape == (3, 16, 32)

    def test_validation(self):
        with pytest.raises(ValueError, match="size must be a positive int"):
            standard_image_transforms(0, train=True)
        with pytest.raises(ValueError, match="scale"):
            standard_image_transforms(8, train=True, scale=(0.5, 0.1))
        with pytest.raises(TypeError, match="ratio"):
            standard_image_transforms(8, train=True, ratio=3)


class TestHelpers:
    def test_apply_to_key(self):
        out = ApplyToKey([lambda x: x + 1, lambda x: x * 2], "v")({"v": 1, "other": "x"})
        assert out == {"v": 4, "other": "x"}
        with pytest.raises(KeyError, match="no 'v' entry"):
            ApplyToKey(abs, "v")({"w": 1})

    def test_check_positive_int(self):
        assert check_positive_int(3, "n", "here") == 3
        assert check_positive_int(None, "n", "here", allow_none=True) is None
        with pytest.raises(TypeError, match="here: n must be a positive int"):
            check_positive_int(True, "n", "here")
        with pytest.raises(ValueError, match="here: n must be a positive int"):
            check_positive_int(0, "n", "here")

    def test_recipe_wraps_its_chain(self):
        class Tiny(Recipe):
            def __init__(self):
                super().__init__()
                self.datapipe = IterableWrapper(range(4)).map(str)

        tiny = Tiny()
        assert list(tiny) == ["0", "1", "2", "3"]
        assert len(tiny) == 4
        assert tiny.pipe is tiny.datapipe
        assert list(tiny.header(2)) == ["0", "1"]
