"""``pipekit.geo.io.handles``: the per-process, per-thread handle cache and its budget."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import rasterio

from pipekit.datasets import RasterDataset
from pipekit.geo import BoundingBox
from pipekit.geo.io import RasterOpener, handles


class TestHandleCache:
    def _files(self, tmp_path, rasters, n):
        paths = []
        for k in range(n):
            transform = rasterio.Affine(30.0, 0.0, rasters.X0 + k * 600, 0.0, -30.0, rasters.Y0)
            paths.append(str(rasters.write_tif(tmp_path / f"f{k}.tif", rasters.pattern(20, 20), rasters.UTM15,
                                               transform)))
        return paths

    def test_lru_closes_beyond_the_count_budget(self, tmp_path, rasters):
        paths = self._files(tmp_path, rasters, 3)
        opener = RasterOpener()
        handles.set_handle_budget(max_files=2)
        first = handles.cached_handle(opener, paths[0])
        assert handles.cached_handle(opener, paths[0]) is first
        second = handles.cached_handle(opener, paths[1])
        handles.cached_handle(opener, paths[0])  # paths[1] is now the least recently used
        handles.cached_handle(opener, paths[2])
        assert handles.cached_handle_count() == 2
        assert second.ds.closed and not first.ds.closed

    def test_byte_budget(self, tmp_path, rasters):
        paths = self._files(tmp_path, rasters, 3)
        opener = RasterOpener()
        cost = handles.cached_handle(opener, paths[0]).cost
        handles.set_handle_budget(max_bytes=2 * cost)
        for p in paths:
            handles.cached_handle(opener, p)
        assert handles.cached_handle_count() == 2
        with pytest.raises(ValueError, match="max_bytes"):
            handles.set_handle_budget(max_bytes=0)
        with pytest.raises(ValueError, match="max_files"):
            handles.set_handle_budget(max_files=True)

    def test_threads_have_their_own_handles(self, utm_scene):
        opener = RasterOpener()
        mine = handles.cached_handle(opener, str(utm_scene["path"]))
        theirs = []
        thread = threading.Thread(target=lambda: theirs.append(handles.cached_handle(opener, str(utm_scene["path"]))))
        thread.start()
        thread.join()
        assert theirs[0] is not mine and not mine.ds.closed

    @pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
    def test_forked_child_never_uses_the_parents_handles(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        q = BoundingBox(utm_scene["transform"].c, utm_scene["transform"].c + 300,
                        utm_scene["transform"].f - 300, utm_scene["transform"].f)
        expected = ds[q]["image"].numpy()
        parent = handles.cached_handle(ds._opener, ds.files[0])
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(ds, q, id(parent), queue))
        child.start()
        result = queue.get(timeout=60)
        child.join(timeout=60)
        assert result["count_before"] == 0
        assert result["same_handle"] is False
        np.testing.assert_array_equal(result["image"], expected)
        # the parent's handle is intact after the child read and exited
        assert handles.cached_handle(ds._opener, ds.files[0]) is parent
        np.testing.assert_array_equal(ds[q]["image"].numpy(), expected)


def _child_reads(ds, q, parent_handle_id, queue):
    before = handles.cached_handle_count()
    image = ds[q]["image"].numpy()
    handle = handles.cached_handle(ds._opener, ds.files[0])
    queue.put({"count_before": before, "same_handle": id(handle) == parent_handle_id, "image": image})
