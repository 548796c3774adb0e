"""``pipekit inspect`` on tar shards (WebDataset): samples, extensions, ``.cls`` classes, sampled image sizes."""

from __future__ import annotations

import io
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipekit.cli._common import CliError, Listing, file_kind, human_bytes, one_line
from pipekit.cli._inspection_images import ImageStats
from pipekit.profiling import format_table

__all__ = ["ShardStats", "ShardReport", "inspect_shards"]


@dataclass
class ShardStats:
    url: str
    name: str
    nbytes: int
    samples: int = 0
    extensions: Counter = field(default_factory=Counter)
    error: str | None = None


@dataclass
class ShardReport:
    root: str
    shards: list[ShardStats]
    classes: Counter
    images: ImageStats
    unlabelled: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [f"cannot read shard {s.url!r}: {s.error}" for s in self.shards if s.error]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "shards",
            "root": self.root,
            "shards": [{"url": s.url, "samples": s.samples, "bytes": s.nbytes, "extensions": dict(s.extensions),
                        "error": s.error} for s in self.shards],
            "samples": sum(s.samples for s in self.shards),
            "classes": {str(k): v for k, v in sorted(self.classes.items(), key=lambda kv: str(kv[0]))},
            "unlabelled": self.unlabelled,
            "images": self.images.as_dict(),
            "errors": self.errors,
            "skipped": self.skipped,
        }

    def render(self) -> str:
        rows = [("shard", "samples", "extensions", "bytes")]
        for s in self.shards:
            if s.error:
                rows.append((s.name, str(s.samples), "unreadable (see below)", human_bytes(s.nbytes)))
            else:
                rows.append((s.name, str(s.samples), ", ".join(f".{k} {v}" for k, v in sorted(s.extensions.items())),
                             human_bytes(s.nbytes)))
        lines = [format_table(rows, align="lrll"), ""]
        if self.classes:
            crow = [("class (.cls)", "samples")]
            crow += [(str(k), str(v)) for k, v in sorted(self.classes.items(), key=lambda kv: _class_sort(kv[0]))]
            lines += [format_table(crow, align="lr"), ""]
        total = sum(s.samples for s in self.shards)
        lines.append(f"{total} sample(s) in {len(self.shards)} shard(s); "
                     f"{human_bytes(sum(s.nbytes for s in self.shards))}")
        if self.classes:
            lines.append(f"{len(self.classes)} class(es) from .cls entries"
                         + (f"; {self.unlabelled} sample(s) without a .cls" if self.unlabelled else ""))
        else:
            lines.append("no .cls entries: no class labels")
        if self.images.sizes:
            lines.append(f"image sizes from {len(self.images.sizes)} sampled image(s): {self.images.size_range()}; "
                         "modes: " + ", ".join(f"{k} {v}" for k, v in self.images.modes.most_common()))
        if self.skipped:
            lines.append(f"{len(self.skipped)} other file(s) ignored, e.g. {self.skipped[0]}")
        for err in self.errors:
            lines.append(f"error: {err}")
        return "\n".join(lines)


def _class_sort(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, str(value))


def _wds_key(member: str) -> tuple[str, str]:
    """WebDataset's split of a member name: the key up to the first dot of the file name, and the extension."""
    directory, _, base = member.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), ext.lower() if dot else ""


def _read_shard(listing: Listing, stats: ShardStats, classes: Counter, images: ImageStats, sample: int) -> int:
    """Stream one shard; returns how many samples had no ``.cls``."""
    from PIL import Image

    unlabelled = 0
    current: str | None = None
    labelled = False
    image_exts = {"jpg", "jpeg", "png", "webp", "bmp", "gif", "ppm", "pgm", "tif", "tiff"}
    opened = open(stats.url, "rb") if listing.local else listing.fs.open(stats.url, "rb")  # noqa: SIM115
    with opened as f, tarfile.open(fileobj=f, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, ext = _wds_key(member.name)
            if key != current:
                if current is not None and not labelled:
                    unlabelled += 1
                current, labelled = key, False
                stats.samples += 1
            stats.extensions[ext] += 1
            last = ext.rsplit(".", 1)[-1]
            if last == "cls":
                data = tar.extractfile(member).read()
                text = data.decode("utf-8", "replace").strip()
                classes[int(text) if text.lstrip("-").isdigit() else text] += 1
                labelled = True
            elif last in image_exts and len(images.sizes) < sample:
                data = tar.extractfile(member).read()
                with Image.open(io.BytesIO(data)) as img:
                    images.sizes.append(img.size)
                    images.modes[img.mode] += 1
                images.formats[last] += 1
    if current is not None and not labelled:
        unlabelled += 1
    return unlabelled


def inspect_shards(listing: Listing, sample: int) -> ShardReport:
    """Stream every tar shard: samples (WebDataset keys), extensions, ``.cls`` classes, sampled image sizes."""
    shards: list[ShardStats] = []
    skipped: list[str] = []
    for url, name, nbytes in listing.files:
        if file_kind(name) == "shard":
            shards.append(ShardStats(url, name, nbytes))
        else:
            skipped.append(name)
    if not shards:
        raise CliError(f"no tar shards (.tar, .tar.gz, .tgz) in {listing.root!r}")
    classes: Counter = Counter()
    images = ImageStats()
    unlabelled = 0
    for stats in shards:
        try:
            unlabelled += _read_shard(listing, stats, classes, images, sample)
        except (tarfile.TarError, OSError, ValueError) as exc:
            stats.error = one_line(exc) or type(exc).__name__
    return ShardReport(listing.root, shards, classes, images, unlabelled if classes else 0, skipped)
