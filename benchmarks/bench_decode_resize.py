"""Per-image CPU of decode and resize variants on bench_vlm.py's data set (issue 42).

For S = 448 and 224, over the set's JPEGs: the current path (declared-size decode at 1/2, 1/4 or
1/8 with simplejpeg, then ``resize_centre_crop``) against variants that could make the per-image
work cheaper, each timed with ``time.process_time`` (CPU time: less sensitive to other load than
wall time), median of alternating passes, with the PSNR of its output against the current path's
(median / minimum over the images; 99: identical). Also prints how far above S the decoded
shorter side is (a box reduce by 2 before the resize would need it at 2S or more).

    python benchmarks/bench_decode_resize.py --data-dir /tmp/bench_vlm [--images 240] [--passes 5]

The data set is bench_vlm.py's (run that first with the same ``--data-dir``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from bench_vlm import read_images

from megatron_energon_lite.decode.image import jpeg_scale
from megatron_energon_lite.decode.resize import centre_crop_box, resize_centre_crop


def _interpolate(chw: torch.Tensor, size: int, antialias: bool = True) -> torch.Tensor:
    return torch.nn.functional.interpolate(chw[None], size=(size, size), mode="bilinear", antialias=antialias, align_corners=False)[0]


def _crop_view(hwc: np.ndarray) -> torch.Tensor:
    """The centre square as a CHW view of the read-only decoded array (torch warns about those)."""
    left, top, side, _ = centre_crop_box(hwc.shape[1], hwc.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(hwc[top : top + side, left : left + side]).permute(2, 0, 1)


def _view_resize(hwc: np.ndarray, size: int, antialias: bool = True) -> torch.Tensor:
    chw = _crop_view(hwc)
    return chw.contiguous() if chw.shape[1] == size else _interpolate(chw, size, antialias).contiguous()


def _rgbx_resize(rgbx: np.ndarray, size: int) -> torch.Tensor:
    """4-channel channels-last input: torch's uint8 kernel then skips its RGB -> RGBA unpacking."""
    left, top, side, _ = centre_crop_box(rgbx.shape[1], rgbx.shape[0])
    return _interpolate(torch.from_numpy(rgbx[top : top + side, left : left + side].copy()).permute(2, 0, 1), size)[:3]


def _decode_sizes(jpegs: list[bytes], size: int, eighths: bool) -> list[dict]:
    """simplejpeg's size arguments per JPEG: the project's scale (1/2, 1/4, 1/8), or with
    ``eighths`` the smallest M/8 libjpeg-turbo offers that keeps the shorter side at least S."""
    sizes = []
    for data in jpegs:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        if eighths:
            m = next((m for m in range(1, 9) if -(-min(width, height) * m // 8) >= size), 8)
            sizes.append({"min_height": -(-height * m // 8), "min_width": -(-width * m // 8)} if m < 8 else {})
        else:
            scale = jpeg_scale(width, height, min_side=size)
            sizes.append({"min_height": -(-height // scale), "min_width": -(-width // scale)} if scale > 1 else {})
    return sizes


def psnr_median_min(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> str:
    values = []
    for ref, out in zip(reference, outputs):
        mse = float(np.mean((ref.numpy().astype(np.float64) - out.numpy()) ** 2))
        values.append(99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse))
    return f"{np.median(values):.1f} / {min(values):.1f}"


def measure(size: int, jpegs: list[bytes], passes: int) -> list[str]:
    sizes, eighths = _decode_sizes(jpegs, size, False), _decode_sizes(jpegs, size, True)
    decoded = [simplejpeg.decode_jpeg(d, colorspace="RGB", **s) for d, s in zip(jpegs, sizes)]
    for array in decoded:
        array.setflags(write=False)  # as the decoder hands them out
    rgbx = [simplejpeg.decode_jpeg(d, colorspace="RGBX", **s) for d, s in zip(jpegs, sizes)]
    over = [min(a.shape[:2]) / size for a in decoded]

    def decode_resize(**options):
        return lambda: [resize_centre_crop(simplejpeg.decode_jpeg(d, colorspace="RGB", **s, **options.get("flags", {})), size)
                        for d, s in zip(jpegs, options.get("sizes", sizes))]

    variants = {
        "resize: current resize_centre_crop (crop copy, torch antialiased bilinear)": lambda: [resize_centre_crop(a, size) for a in decoded],
        "resize: the crop as a read-only view, no copy": lambda: [_view_resize(a, size) for a in decoded],
        "resize: RGBX pixels (no 3 -> 4 channel unpacking in torch)": lambda: [_rgbx_resize(a, size) for a in rgbx],
        "resize: bilinear without antialiasing": lambda: [_view_resize(a, size, antialias=False) for a in decoded],
        "decode at 1/2, 1/4, 1/8 (current) + resize": decode_resize(),
        "decode at the smallest M/8 + resize": decode_resize(sizes=eighths),
        "fastdct + fastupsample decode + resize": decode_resize(flags={"fastdct": True, "fastupsample": True}),
        "declared-size decode alone": lambda: [simplejpeg.decode_jpeg(d, colorspace="RGB", **s) for d, s in zip(jpegs, sizes)],
    }
    reference = variants["resize: current resize_centre_crop (crop copy, torch antialiased bilinear)"]()
    outputs = {name: run() for name, run in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(passes):
        for name in list(variants) if index % 2 == 0 else list(variants)[::-1]:
            start = time.process_time()
            variants[name]()
            times[name].append((time.process_time() - start) / len(jpegs) * 1e3)
    rows = [f"S={size}: {len(jpegs)} JPEGs; decoded shorter side / S: min {min(over):.2f}, median {np.median(over):.2f}, "
            f"max {max(over):.2f}; at 2 or more: {sum(v >= 2 for v in over)}"]
    for name in variants:
        quality = psnr_median_min(reference, outputs[name]) if "alone" not in name else ""
        rows.append(f"| {size} | {name} | {statistics.median(times[name]):.3f} | {quality} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/bench_vlm"))
    parser.add_argument("--images", type=int, default=240)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shards = [str(p) for p in sorted((args.data_dir / "data").glob("*.tar"))]
    jpegs = [d for d in read_images(shards, args.images) if d[:2] == b"\xff\xd8"]
    print("| S | variant | CPU ms per image (median) | PSNR dB vs current: median / min |")
    print("|---|---|---:|---|")
    for size in (448, 224):
        for row in measure(size, jpegs, args.passes):
            print(row)


if __name__ == "__main__":
    main()
