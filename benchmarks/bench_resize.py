"""Resize-and-centre-crop candidates for a VLM task encoder, on this machine (issue 42).

Resizes an RGB image so its shorter side is S, centre-crops S x S and returns a uint8 CHW torch
tensor, with each candidate; prints the median time per image and the PSNR of each against a
float64 reference (Pillow's antialiased bilinear filter run in float on the same crop box).

    python benchmarks/bench_resize.py [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from PIL import Image

from megatron_energon_lite.decode.resize import resize_centre_crop


def centre_box(width: int, height: int) -> tuple[float, float, float, float]:
    """The centre square as Pillow's (left, top, right, bottom), not rounded."""
    side = min(width, height)
    return (width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2


def _photo(width: int, height: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / width, yy * 255 / height, 128 + 100 * np.sin(xx / 9.0) * np.cos(yy / 13.0)], axis=2)
    base += np.random.default_rng(0).normal(0, 10, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def pillow_resize_then_crop(hwc: np.ndarray, size: int) -> torch.Tensor:
    """What an Energon user writes: resize the whole image, then crop."""
    img = Image.fromarray(hwc)
    w, h = img.size
    scale = size / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BILINEAR)
    left, top = (img.width - size) // 2, (img.height - size) // 2
    img = img.crop((left, top, left + size, top + size))
    return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())


def pillow_box(hwc: np.ndarray, size: int, reducing_gap: float | None = None) -> torch.Tensor:
    img = Image.fromarray(hwc)
    out = img.resize((size, size), Image.Resampling.BILINEAR, box=centre_box(img.width, img.height), reducing_gap=reducing_gap)
    return torch.from_numpy(np.asarray(out).transpose(2, 0, 1).copy())


def cv2_area(hwc: np.ndarray, size: int) -> torch.Tensor:
    import cv2

    left, top, right, bottom = (round(v) for v in centre_box(hwc.shape[1], hwc.shape[0]))
    out = cv2.resize(hwc[top:bottom, left:right], (size, size), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(out.transpose(2, 0, 1).copy())


def torch_antialias(hwc: np.ndarray, size: int) -> torch.Tensor:
    left, top, right, bottom = (round(v) for v in centre_box(hwc.shape[1], hwc.shape[0]))
    chw = torch.from_numpy(hwc[top:bottom, left:right]).permute(2, 0, 1).unsqueeze(0)  # channels-last memory: uint8 fast path
    out = torch.nn.functional.interpolate(chw, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out[0].contiguous()


def reference(hwc: np.ndarray, size: int) -> np.ndarray:
    planes = [np.asarray(Image.fromarray(hwc[..., c].astype(np.float32), "F").resize((size, size), Image.Resampling.BILINEAR, box=centre_box(hwc.shape[1], hwc.shape[0]))) for c in range(3)]
    return np.stack(planes)


def psnr(out: torch.Tensor, ref: np.ndarray) -> float:
    mse = float(np.mean((out.numpy().astype(np.float64) - ref) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    candidates = {
        "Pillow resize, then crop": pillow_resize_then_crop,
        "Pillow resize(box=crop)": pillow_box,
        "Pillow resize(box, reducing_gap=2)": lambda a, s: pillow_box(a, s, 2.0),
        "cv2 INTER_AREA on the crop": cv2_area,
        "torch interpolate(antialias) uint8": torch_antialias,
        "library: resize_centre_crop (numpy in)": lambda a, s: resize_centre_crop(a, s),
        "library: resize_centre_crop (CHW torch in)": lambda a, s: resize_centre_crop(chw, s),
    }
    print("| source | S | candidate | ms/image (median) | PSNR vs float reference (dB) |")
    print("|---|---|---|---|---|")
    for width, height in ((1600, 1200), (800, 600), (640, 480)):
        hwc = _photo(width, height)
        chw = torch.from_numpy(hwc.transpose(2, 0, 1).copy())  # what image_decode="torchrgb8" gives
        for size in (448, 224):
            ref = reference(hwc, size)
            for name, fn in candidates.items():
                out = fn(hwc, size)
                times = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    fn(hwc, size)
                    times.append(time.perf_counter() - start)
                print(f"| {width}x{height} | {size} | {name} | {statistics.median(times) * 1e3:.2f} | {psnr(out, ref):.1f} |")


if __name__ == "__main__":
    main()
