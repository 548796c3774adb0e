"""``pipekit inspect`` on image folders: counts per class, formats and (sampled) image sizes."""

from __future__ import annotations

import concurrent.futures
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipekit.cli._common import CliError, Listing, file_kind, human_bytes, one_line
from pipekit.profiling import format_table

__all__ = ["ImageStats", "ImageReport", "inspect_images"]

_THREADS = 8


@dataclass
class ImageStats:
    """Counts, formats and (sampled) sizes of a group of images."""

    count: int = 0
    nbytes: int = 0
    formats: Counter = field(default_factory=Counter)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    modes: Counter = field(default_factory=Counter)

    def add_header(self, data: Any) -> None:
        from PIL import Image

        with Image.open(data) as img:
            self.sizes.append(img.size)
            self.modes[img.mode] += 1

    def size_range(self) -> str:
        if not self.sizes:
            return "-"
        ws = [w for w, _ in self.sizes]
        hs = [h for _, h in self.sizes]
        if min(ws) == max(ws) and min(hs) == max(hs):
            return f"{ws[0]}x{hs[0]}"
        return f"{min(ws)}x{min(hs)} .. {max(ws)}x{max(hs)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "bytes": self.nbytes,
            "formats": dict(self.formats),
            "modes": dict(self.modes),
            "sizes_sampled": len(self.sizes),
            "min_size": [min(w for w, _ in self.sizes), min(h for _, h in self.sizes)] if self.sizes else None,
            "max_size": [max(w for w, _ in self.sizes), max(h for _, h in self.sizes)] if self.sizes else None,
        }


def _ext(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    return base.rsplit(".", 1)[-1].lower() if "." in base else ""


@dataclass
class ImageReport:
    root: str
    classes: dict[str, ImageStats]
    sampled: int
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self) -> ImageStats:
        out = ImageStats()
        for s in self.classes.values():
            out.count += s.count
            out.nbytes += s.nbytes
            out.formats.update(s.formats)
            out.sizes.extend(s.sizes)
            out.modes.update(s.modes)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "images", "root": self.root, "classes": {k: v.as_dict() for k, v in self.classes.items()},
                "total": self.total().as_dict(), "errors": self.errors, "skipped": self.skipped}

    def render(self) -> str:
        rows = [("class", "images", "formats", "sizes (sampled)", "modes", "bytes")]
        for name, s in self.classes.items():
            rows.append((name, str(s.count), ", ".join(f"{k} {v}" for k, v in s.formats.most_common()),
                         s.size_range(), ", ".join(f"{k} {v}" for k, v in s.modes.most_common()) or "-",
                         human_bytes(s.nbytes)))
        total = self.total()
        lines = [format_table(rows, align="lrllll"), ""]
        lines.append(f"{total.count} image(s) in {len(self.classes)} class(es); formats: "
                     + ", ".join(f"{k} {v}" for k, v in total.formats.most_common())
                     + f"; {human_bytes(total.nbytes)}")
        counts = [s.count for s in self.classes.values()]
        if len(counts) > 1:
            lines.append(f"images per class: {min(counts)} .. {max(counts)}"
                         + (" (imbalanced: consider a weighted sampler)" if max(counts) > 2 * min(counts) else ""))
        if total.sizes:
            lines.append(f"sizes from {len(total.sizes)} sampled header(s): {total.size_range()}")
        if self.skipped:
            lines.append(f"{len(self.skipped)} other file(s) ignored, e.g. {self.skipped[0]}")
        for err in self.errors:
            lines.append(f"error: {err}")
        return "\n".join(lines)


def _class_of(name: str) -> str:
    return name.split("/", 1)[0] if "/" in name else "(root)"


def _spread(items: list[Any], k: int) -> list[Any]:
    """``k`` items spread evenly over ``items`` (all of them if fewer)."""
    if len(items) <= k:
        return list(items)
    step = len(items) / k
    return [items[int(i * step)] for i in range(k)]


def inspect_images(listing: Listing, sample: int) -> ImageReport:
    """Count the images of a class-per-folder tree and read a sample of their headers."""
    classes: dict[str, ImageStats] = {}
    members: dict[str, list[str]] = {}
    skipped: list[str] = []
    for url, name, nbytes in listing.files:
        if file_kind(name) != "image":
            skipped.append(name)
            continue
        cls = _class_of(name) if not listing.is_file else "(root)"
        stats = classes.setdefault(cls, ImageStats())
        stats.count += 1
        stats.nbytes += nbytes
        stats.formats[_ext(name)] += 1
        members.setdefault(cls, []).append(url)
    if not classes:
        raise CliError(f"no images (.jpg, .png, .webp...) in {listing.root!r}")
    classes = dict(sorted(classes.items()))
    per_class = max(1, math.ceil(sample / len(classes)))
    picks = [(cls, url) for cls in classes for url in _spread(members[cls], per_class)][: max(sample, len(classes))]
    errors: list[str] = []

    def header(item: tuple[str, str]) -> tuple[str, str, Exception | None]:
        cls, url = item
        try:
            if listing.local:
                classes[cls].add_header(url)
            else:
                with listing.fs.open(url, "rb", block_size=2**16) as f:
                    classes[cls].add_header(f)
        except Exception as exc:
            return cls, url, exc
        return cls, url, None

    with concurrent.futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="pipekit-inspect") as pool:
        for _cls, url, exc in pool.map(header, picks):
            if exc is not None:
                errors.append(f"cannot read the image header of {url!r}: {one_line(exc)}")
    return ImageReport(listing.root, classes, len(picks), skipped, errors)
