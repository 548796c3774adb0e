"""The band files of ``separate_files`` products: which files form a scene, and where each band is read from.

A :class:`~pipekit.geo.catalog.FileCatalog` of a product with one file per
band (Landsat, Sentinel-2) groups the files it lists into scenes with
:class:`SceneRules`, either by pipekit's rule (the files whose names agree in
every regex group but ``band`` and the variant groups) or by TorchGeo's (one
scene per file a band-naming ``filename_glob`` finds, the other bands
substituted in its name), and records where each file's band name lies in
its path (:func:`band_columns`) so that the file table derives the other
bands' paths.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipekit.errors import ReadError, StageError
from pipekit.geo.catalog._listing import _split_name
from pipekit.geo.catalog._scenes import group_scenes

__all__ = ["Scene", "SceneRules", "band_columns"]

#: ``(index file, its match, {band: file})``
Scene = tuple[str, re.Match[str], dict[str, str]]


class SceneRules:
    """How the band files of a product form scenes.

    Args:
        bands: the bands read, in order (the first is the index file's, where a scene has it).
        all_bands: the product's band names.
        variant_groups: regex groups that may differ between the files of one
            scene besides ``band`` (e.g. Sentinel-2's ``resolution``).
        name: the dataset's name (errors).
        skip_or_raise: reports a scene missing a band (``on_error``).
    """

    def __init__(self, bands: Sequence[Any], all_bands: Sequence[str], variant_groups: Sequence[str], name: str,
                 skip_or_raise: Callable[[StageError], None]) -> None:
        self.bands = bands
        self.all_bands = all_bands
        self.variant_groups = variant_groups
        self.name = name
        self.skip_or_raise = skip_or_raise

    def check_bands_found(self, matched: list[tuple[str, re.Match[str]]], root: Any) -> None:
        """Refuse bands outside ``all_bands`` that no file found holds (a typo, or a band the scenes do not carry).

        (A band of ``all_bands`` missing from a scene is reported per scene, see :meth:`_complete_scene`.)
        """
        found = {match.group("band") for _, match in matched}
        missing = [b for b in self.bands if b not in found and b not in self.all_bands]
        if missing:
            raise ValueError(
                f"{self.name} has no band(s) {missing} in the files found in {root!r}: they hold bands "
                f"{sorted(found)} (its all_bands are {list(self.all_bands)})"
            )

    def group(self, matched: list[tuple[str, re.Match[str]]]) -> list[Scene]:
        """Band files grouped into scenes: ``(index file, its match, {band: file})`` for complete scenes.

        The scenes are :func:`~pipekit.geo.catalog._scenes.group_scenes`': the files
        whose names agree in every regex group except ``band`` and the
        variant groups (e.g. Sentinel-2's ``resolution``), wherever
        they lie (Sentinel-2 Level-2A keeps its 10, 20 and 60 m bands in
        sibling folders) -- unless two of them would hold the same band and
        variant, in which case each folder is a scene of its own.  The index
        file is the finest copy of the first requested band; each band is read
        from its finest copy.  A scene missing a requested band is reported
        (``ReadError``, or recorded with ``on_error="skip"``).
        """
        scenes = []
        for files in group_scenes(matched, self.variant_groups):
            scene = self._complete_scene(files)
            if scene is not None:
                scenes.append(scene)
        scenes.sort(key=lambda scene: scene[0])
        return scenes

    def of_glob_matches(self, matched: list[tuple[str, re.Match[str]]], origins: dict[str, str]) -> list[Scene]:
        """TorchGeo's rule for a ``filename_glob`` that names a band: one scene per file the glob finds.

        Each band is read from the file whose name is the scene file's with
        the band substituted (in the same folder), as TorchGeo reads it; where
        no such file exists, from the finest copy of the band among the files
        of the same scene (the names agree in every other group), if any.
        """
        known = {path for path, _ in matched}
        by_scene: dict[tuple[Any, ...], list[tuple[str, re.Match[str]]]] = {}
        for path, match in matched:
            by_scene.setdefault(self._scene_key(match), []).append((path, match))
        scenes = []
        for path, match in matched:
            if origins.get(path) == "sibling":
                continue  # found beside a scene file: a band file, not a scene of its own
            directory, name = _split_name(path)
            start, stop = match.span("band")
            chosen: dict[str, str] = {}
            for band in self.bands:
                candidate = directory + name[:start] + band + name[stop:]
                if candidate in known:
                    chosen[band] = candidate
                    continue
                options = sorted(
                    (self._variant_rank(m), _split_name(p)[0] != directory, p)
                    for p, m in by_scene[self._scene_key(match)] if m.group("band") == band
                )
                if not options:
                    self.skip_or_raise(ReadError(
                        "find band file", candidate, self.name,
                        f"band {band!r} of the scene of {name!r} is missing (separate_files: one file per band)",
                    ))
                    break
                chosen[band] = options[0][2]
            else:
                scenes.append((path, match, chosen))
        return scenes

    def _scene_key(self, match: re.Match[str]) -> tuple[Any, ...]:
        """What the files of one scene share: every regex group but ``band`` and the variant groups."""
        skip = {"band", *self.variant_groups}
        return tuple(sorted((k, v) for k, v in match.groupdict().items() if k not in skip))

    def _complete_scene(self, files: dict[tuple[Any, ...], tuple[str, re.Match[str]]]) -> Scene | None:
        by_band: dict[str, list[tuple[tuple[float, str], str, re.Match[str]]]] = {}
        for (band, *_), (path, match) in files.items():
            by_band.setdefault(band, []).append((self._variant_rank(match), path, match))
        for options in by_band.values():
            options.sort(key=lambda option: (option[0], option[1]))
        first = self.bands[0]
        if first in by_band:
            _, index_path, index_match = by_band[first][0]
        else:
            _, index_path, index_match = min(option for options in by_band.values() for option in options)
        directory, name = _split_name(index_path)
        start, stop = index_match.span("band")
        chosen: dict[str, str] = {}
        for band in self.bands:
            options = by_band.get(band)
            if not options:
                self.skip_or_raise(ReadError(
                    "find band file", directory + name[:start] + band + name[stop:], self.name,
                    f"band {band!r} of the scene of {name!r} is missing (separate_files: one file per band)",
                ))
                return None
            best = options[0][0]
            same_folder = [o for o in options if o[0] == best and _split_name(o[1])[0] == directory]
            chosen[band] = (same_folder or options)[0][1]
        return index_path, index_match, chosen

    def _variant_rank(self, match: re.Match[str]) -> tuple[float, str]:
        """Sort key among the files of one band: the finest resolution (digits of the variant group) first."""
        for group in self.variant_groups:
            value = match.groupdict().get(group)
            if value:
                digits = re.sub(r"\D", "", value)
                return (float(digits) if digits else math.inf, value)
        return (-math.inf, "")


def band_columns(paths: list[str], matches: list[re.Match[str]],
                 bands_of: list[dict[str, str]]) -> tuple[np.ndarray, dict[tuple[int, str], str]]:
    """Where each file's band name lies in its path, and the band files not found by substituting it.

    Returns ``(spans, overrides)``: ``[n, 2]`` int64 character spans of the
    band name in each path, and ``{(row, band): path}`` for the bands whose
    file is not the row's path with the band name substituted.
    """
    offsets = np.fromiter((len(_split_name(path)[0]) for path in paths), dtype=np.int64, count=len(paths))
    spans = np.array(list(map(operator.methodcaller("span", "band"), matches)), dtype=np.int64).reshape(-1, 2)
    band_spans = spans + offsets[:, None]
    band_overrides: dict[tuple[int, str], str] = {}
    for k, (path, (start, stop), bands) in enumerate(zip(paths, band_spans.tolist(), bands_of)):
        head, tail = path[:start], path[stop:]
        for band, other in bands.items():
            if other != head + band + tail:
                band_overrides[(k, band)] = other
    return band_spans, band_overrides
