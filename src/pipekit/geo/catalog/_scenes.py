"""Band files grouped into scenes (``separate_files`` products such as Landsat and Sentinel-2).

:func:`group_scenes` groups the files :func:`~pipekit.geo.catalog._listing.find_files`
matched by their ``filename_regex`` groups, band and variant groups aside.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from pipekit.geo.catalog._listing import _split_name

__all__ = ["Scene", "group_scenes"]

#: one scene of band files: ``{(band, *variants): (path, its filename_regex match)}``
Scene = dict[tuple[Any, ...], tuple[str, "re.Match[str]"]]


def group_scenes(
    matched: Iterable[tuple[str, re.Match[str]]], variant_groups: Sequence[str] = ("resolution",)
) -> list[Scene]:
    """Band files grouped into scenes, each ``{(band, *variants): (path, match)}``.

    A scene is the files whose names agree in every ``filename_regex`` group
    except ``band`` and the ``variant_groups`` (e.g. Sentinel-2's
    ``resolution``), wherever they lie (Sentinel-2 Level-2A keeps its 10, 20
    and 60 m bands in sibling folders) -- unless two of them would hold the
    same band and variant, in which case each folder is a scene of its own.
    Scenes come in the order of their first file in ``matched`` (the
    folders of a split scene in sorted order); of files of one folder that
    agree in every group, the last one is kept.

    Example:
        >>> import re
        >>> regex = re.compile(r"(?P<scene>S[0-9])_(?P<band>B[0-9])(?:_(?P<resolution>[0-9]+m))?[.]tif$")
        >>> names = ["a/S1_B1.tif", "a/S1_B2.tif", "b/S1_B3_20m.tif", "a/S2_B1.tif"]
        >>> scenes = group_scenes([(n, regex.search(n)) for n in names])
        >>> [sorted(path for path, _ in scene.values()) for scene in scenes]
        [['a/S1_B1.tif', 'a/S1_B2.tif', 'b/S1_B3_20m.tif'], ['a/S2_B1.tif']]
        >>> sorted(scenes[0])
        [('B1', None), ('B2', None), ('B3', '20m')]
    """
    variants = tuple(variant_groups)
    groups: dict[tuple[Any, ...], dict[str, Scene]] = {}
    for path, match in matched:
        gd = match.groupdict()
        key = tuple(sorted((k, v) for k, v in gd.items() if k != "band" and k not in variants))
        band_variant = (gd.get("band"), *(gd.get(g) for g in variants))
        directory = _split_name(path)[0]
        groups.setdefault(key, {}).setdefault(directory, {})[band_variant] = (path, match)
    scenes: list[Scene] = []
    for dirs in groups.values():
        merged: Scene = {}
        collision = False
        for directory in sorted(dirs):
            for band_variant, found in dirs[directory].items():
                collision = collision or band_variant in merged
                merged[band_variant] = found
        scenes.extend([merged] if not collision else [dirs[d] for d in sorted(dirs)])
    return scenes
