"""Where a command writes a figure (`yxanul compare --out`, `yxanul plot-lr --out`): a file whose suffix names a
format matplotlib writes, checked before any work, so that a typo is one line instead of a traceback after the
plotting (``.yaml``: "Format 'yaml' is not supported"), and a folder is never taken for the file; and how it is
written (`save_figure`): a path that cannot be written is one line too."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, UserError, path_error_line

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


def save_figure(fig, path: str | Path, label: str, **savefig) -> None:
    """Write ``fig`` to ``path`` (its folders made first) and close it; a path that cannot be written (read-only,
    /proc, no space) is one line naming ``label`` (``compare --out``) and the path, not a traceback."""
    import matplotlib.pyplot as plt  # matplotlib: only where a figure is written, never for --help

    try:
        Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, **savefig)
    except OSError as e:
        if path_error_line(e):  # the CLI prints it: it names the part in the way and the fix
            raise
        raise UserError(f"{label} '{path}': cannot be written ({e.strerror or e}); choose another path") from None
    finally:
        plt.close(fig)
