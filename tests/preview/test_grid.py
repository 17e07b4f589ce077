"""``preview --grid``: a contact sheet with one cell per sample, each showing that sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from preview_helpers import CAPTIONING_YAML, COLOURS, make_dataset, png, run, solid

from megatron_energon_lite.preview.grid import CELL_SIZE, THUMB_SIZE


def _cell(sheet: np.ndarray, n: int, columns: int) -> np.ndarray:
    x, y = (n % columns) * CELL_SIZE[0], (n // columns) * CELL_SIZE[1]
    return sheet[y : y + CELL_SIZE[1], x : x + CELL_SIZE[0]]


def test_grid_has_a_cell_per_sample_showing_its_image(tmp_path: Path) -> None:
    samples = [(f"g{i}", {"png": png(solid(colour, (64, 32))), "txt": f"caption {i}".encode()}) for i, colour in enumerate(COLOURS)]
    samples.append(("g6", {"png": png(solid((0, 0, 0))), "txt": b"last"}))
    root = make_dataset(tmp_path / "grid", samples, CAPTIONING_YAML)
    out = tmp_path / "sheet.png"
    result = run("preview", str(root), "-n", "7", "--grid", str(out), "--grid-columns", "3")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"Wrote 7 samples to {out}"
    sheet = Image.open(out)
    assert sheet.format == "PNG" and sheet.size == (3 * CELL_SIZE[0], 3 * CELL_SIZE[1])  # 7 cells: 3 rows of 3
    pixels = np.asarray(sheet.convert("RGB")).astype(int)
    for n, colour in enumerate([*COLOURS, (0, 0, 0)]):
        cell = _cell(pixels, n, 3)
        centre = cell[8 + THUMB_SIZE[1] // 2, 8 + THUMB_SIZE[0] // 2]
        assert np.abs(centre - colour).max() <= 2, (n, centre, colour)
        caption = cell[8 + THUMB_SIZE[1] + 4 :, 8 : 8 + THUMB_SIZE[0]]
        assert (caption.sum(axis=2) < 300).sum() > 20  # dark caption text is there
    assert (_cell(pixels, 7, 3) == 255).all() and (_cell(pixels, 8, 3) == 255).all()  # empty cells stay white


def test_grid_marks_a_broken_sample_and_draws_the_others(tmp_path: Path) -> None:
    samples = [("ok0", {"png": png(solid(COLOURS[0])), "txt": b"fine"}), ("bad", {"png": b"\x89PNG not really", "txt": b"broken"}), ("ok2", {"png": png(solid(COLOURS[2])), "txt": b"fine"})]
    root = make_dataset(tmp_path / "broken", samples, CAPTIONING_YAML)
    out = tmp_path / "sheet.png"
    assert run("preview", str(root), "--grid", str(out)).exit_code == 0
    pixels = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert pixels.shape == (CELL_SIZE[1], 3 * CELL_SIZE[0], 3)
    bad = _cell(pixels, 1, 3)
    reddish = (bad[..., 0] > 120) & (bad[..., 1] < 80) & (bad[..., 2] < 100)
    assert reddish.sum() > 30  # the error text, in red
    assert np.abs(_cell(pixels, 2, 3)[8 + THUMB_SIZE[1] // 2, 8 + THUMB_SIZE[0] // 2] - COLOURS[2]).max() <= 2
