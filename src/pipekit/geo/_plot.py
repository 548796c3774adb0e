"""Rendering geo samples with matplotlib (the optional ``plot`` extra).

:func:`plot_sample` draws a sample's image as RGB (2-98 percentile stretch
per channel), its mask (and a ``"prediction"``, if any) with a colour map and
a legend of the classes present, and returns the Figure.  Datasets call it
from ``dataset.plot(sample)`` with their product's RGB bands and colours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["plot_sample", "stretch", "require_matplotlib"]


def require_matplotlib() -> Any:
    """``matplotlib.pyplot``, or an ImportError that says how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "plotting geo samples needs matplotlib, which pipekit installs with its 'plot' extra: "
            "pip install 'pipekit[plot]'"
        ) from exc
    return plt


def stretch(image: np.ndarray, low: float = 2.0, high: float = 98.0) -> np.ndarray:
    """Scale each channel of ``[H, W, C]`` ``image`` to [0, 1] between its ``low`` and ``high`` percentiles.

    NaNs are ignored and shown as 0.

    Example:
        >>> import numpy as np
        >>> out = stretch(np.arange(100, dtype=float).reshape(10, 10, 1))
        >>> float(out.min()), float(out.max()), out.shape
        (0.0, 1.0, (10, 10, 1))
    """
    image = np.asarray(image, dtype=np.float64)
    out = np.zeros_like(image)
    for c in range(image.shape[-1]):
        channel = image[..., c]
        finite = channel[np.isfinite(channel)]
        if finite.size == 0:
            continue
        lo, hi = np.percentile(finite, [low, high])
        scale = hi - lo if hi > lo else 1.0
        out[..., c] = np.clip((np.nan_to_num(channel, nan=lo) - lo) / scale, 0.0, 1.0)
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _colour_table(cmap: Mapping[int, Sequence[int]] | None, values: np.ndarray) -> dict[int, tuple[float, ...]]:
    """RGBA (0-1) for each class value present; classes without a colour get matplotlib's tab20."""
    import matplotlib

    fallback = matplotlib.colormaps["tab20"]
    table: dict[int, tuple[float, ...]] = {}
    for k, v in enumerate(sorted(int(x) for x in values)):
        if cmap is not None and v in cmap:
            rgba = tuple(cmap[v])
            if len(rgba) == 3:
                rgba = (*rgba, 255)
            table[v] = tuple(c / 255.0 for c in rgba)
        else:
            table[v] = tuple(fallback(k % 20))
    return table


def _draw_mask(ax: Any, mask: np.ndarray, cmap: Mapping[int, Sequence[int]] | None,
               class_names: Mapping[int, str] | None, title: str | None, legend: bool) -> None:
    import matplotlib.patches as mpatches

    mask = mask.astype(np.int64)
    values = np.unique(mask)
    table = _colour_table(cmap, values)
    rgba = np.zeros((*mask.shape, 4), dtype=np.float64)
    for v, colour in table.items():
        rgba[mask == v] = colour
    ax.imshow(rgba, interpolation="nearest")
    ax.axis("off")
    if title:
        ax.set_title(title)
    if legend:
        handles = [
            mpatches.Patch(
                facecolor=table[v][:3],
                edgecolor="black",
                label=f"{v}: {class_names[v]}" if class_names and v in class_names else str(v),
            )
            for v in sorted(table)
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def plot_sample(
    sample: Mapping[str, Any],
    rgb: Sequence[int] | None = None,
    cmap: Mapping[int, Sequence[int]] | None = None,
    class_names: Mapping[int, str] | None = None,
    show_titles: bool = True,
    suptitle: str | None = None,
) -> Any:
    """Draw a geo sample and return the matplotlib Figure.

    Args:
        sample: a dict with ``"image"`` (``[C, H, W]``) and/or ``"mask"``
            (``[H, W]`` or ``[C, H, W]``, first channel shown) and optionally
            ``"prediction"`` (like the mask).
        rgb: channel indices of red, green, blue in the image (default: the
            first three channels, or the first channel in grey).
        cmap: ``{class value: (r, g, b[, a])}`` in 0-255 for masks.
        class_names: ``{class value: name}`` for the legend.
        show_titles: title each panel.
        suptitle: a title for the whole figure.

    Raises:
        ImportError: matplotlib is not installed (names the ``plot`` extra).
        ValueError: the sample has neither ``"image"`` nor ``"mask"``.
    """
    plt = require_matplotlib()
    panels: list[tuple[str, np.ndarray]] = []
    if "image" in sample:
        panels.append(("image", _to_numpy(sample["image"])))
    for key in ("mask", "prediction"):
        if key in sample:
            array = _to_numpy(sample[key])
            if array.ndim == 3:
                array = array[0]
            panels.append((key, array))
    if not panels:
        raise ValueError(f"nothing to plot: the sample has no 'image' or 'mask' (keys: {sorted(sample)})")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1.5, 4.5), squeeze=False)
    for ax, (key, array) in zip(axes[0], panels):
        if key == "image":
            if array.ndim == 2:
                array = array[None]
            channels = array.shape[0]
            if rgb is not None and all(0 <= c < channels for c in rgb):
                chosen = list(rgb)
            elif channels >= 3:
                chosen = [0, 1, 2]
            else:
                chosen = [0]
            picture = stretch(np.moveaxis(array[chosen], 0, -1))
            ax.imshow(picture[..., 0] if picture.shape[-1] == 1 else picture,
                      cmap="gray" if picture.shape[-1] == 1 else None)
            ax.axis("off")
            if show_titles:
                ax.set_title("Image")
        else:
            _draw_mask(ax, array, cmap, class_names, key.capitalize() if show_titles else None, legend=True)
    if suptitle is not None:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig
