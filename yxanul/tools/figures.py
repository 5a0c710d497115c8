"""Where a command writes a figure (`yxanul compare --out`, `yxanul plot-lr --out`): a file whose suffix names a
format matplotlib writes, checked before any work, so that a typo is one line instead of a traceback after the
plotting (``.yaml``: "Format 'yaml' is not supported"), and a folder is never taken for the file."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError

# matplotlib's Agg canvas's formats (`FigureCanvasBase.get_supported_filetypes()`); written out, not asked of
# matplotlib, which would make --help and every flag error import it
FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")


def check_figure_out(key: str, value: str | None) -> None:
    """``value``: a path ending in a format of `FORMATS`, not an existing folder (None: the command's default)."""
    if value is None:
        return
    p = Path(value)
    if p.is_dir():
        raise ConfigError(key, "an image file path such as plot.png (it is a folder)", value)
    if p.suffix.lower().lstrip(".") not in FORMATS:
        raise ConfigError(key, f"an image file ending in .png, .pdf, .svg (or {', .'.join(FORMATS)})", value)
