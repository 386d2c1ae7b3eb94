#!/usr/bin/env python3
"""make_image_fixtures.py — reference fixtures for squad's image module (src/image/), made with the
real transformers image processor that Qwen3.5 checkpoints use.

    python3 tools/make_image_fixtures.py OUT_DIR        (e.g. tests/fixtures/images/)

Needs PyTorch, torchvision, transformers 5.x, Pillow and numpy; no network (nothing is downloaded:
the processor is built from the preprocessor_config.json values written out below). It writes into
OUT_DIR a few deterministic images (PNG, JPEG and WebP encoded by PIL: a 1920x1080 screenshot-like
picture, an odd-sized photo-like one, a tiny one, RGBA, grey, palette, 16-bit grey, CMYK, a tall
narrow one) and fixture.json:
  - versions: the libraries that made it;
  - configs: the preprocessor configurations used ("qwen3.5": the checkpoints' values; "small": a
    small pixel budget, to exercise strong antialiased downscaling);
  - processor: the class transformers' AutoImageProcessor built for each configuration and its
    backend (torchvision for the default Qwen2VLImageProcessor of transformers 5.x);
  - grids: for many sizes, the grid (t, h, w) the processor gives a blank image of that size, or
    the error it raises;
  - images: per (file, config): the size, the decoded RGB of PIL's Image.open(f).convert("RGB")
    (its BLAKE2b-128 and every rgb_stride-th byte), the grid, pixel_values' shape, BLAKE2b-128 of
    the float32 little-endian bytes (every value, to the bit), sum and sum of absolute values,
    every pv_stride-th value, the first and last patch whole for the qwen3.5 configuration (values
    to 7 significant digits), and how far transformers' PIL backend (Qwen2VLImageProcessorPil,
    when present) lands from the default one.
Everything stays under about 1 MB. tests/test_image.c reads it.
"""
import hashlib
import json
import math
import os
import platform
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import PIL  # noqa: E402
from PIL import Image  # noqa: E402

# Qwen3.5's preprocessor_config.json, as every Qwen/Qwen3.5-* checkpoint on the Hugging Face Hub
# ships it (e.g. Qwen/Qwen3.5-2B-Base/preprocessor_config.json; the same values as Qwen3-VL's):
# 16x16 patches, 2 frames, 2x2 merge, pixels between 256x256 and 4096x4096, mean and std 0.5.
QWEN35_CONFIG = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
# The same with a small budget (64x64 .. 512x512 pixels): big images shrink by 3-4x.
SMALL_CONFIG = dict(QWEN35_CONFIG, size={"longest_edge": 262144, "shortest_edge": 4096})
CONFIGS = {"qwen3.5": QWEN35_CONFIG, "small": SMALL_CONFIG}

MAX_RGB_SAMPLES = 1000
MAX_PV_SAMPLES = 600
PV_STRIDE = 97  # a prime, so the samples walk through channels, frames and pixel positions


def blake2b_128(data):
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def short(v):
    return float(f"{float(v):.7g}")


# ---- deterministic images ----


def screenshot(rng, w=1920, h=1080):
    """A UI-like picture: flat panels, borders, glyph-like text, a photo, gradients, thin lines."""
    img = np.full((h, w, 3), 246, np.uint8)
    img[:64] = (32, 41, 64)  # top bar
    img[64:, :260] = (236, 239, 244)  # sidebar
    for i in range(12):  # sidebar entries
        img[96 + i * 44:96 + i * 44 + 28, 24:236] = (225, 229, 238) if i != 3 else (66, 133, 244)

    font = rng.random((40, 11, 6)) < 0.33  # a 40-glyph "font": text repeats, as real text does

    def text(x0, y0, width, lines, color):
        for line in range(lines):
            x, y = x0, y0 + line * 20
            while x < x0 + width - 60:
                for _ in range(int(rng.integers(2, 9))):
                    glyph = font[int(rng.integers(0, len(font)))]
                    region = img[y:y + glyph.shape[0], x:x + glyph.shape[1]]
                    region[glyph[:region.shape[0], :region.shape[1]]] = color
                    x += glyph.shape[1] + 1
                x += 7

    text(300, 20, 600, 1, (240, 240, 240))
    for i in range(6):  # cards
        x0, y0 = 300 + (i % 3) * 530, 110 + (i // 3) * 470
        img[y0:y0 + 420, x0:x0 + 490] = 255
        img[y0, x0:x0 + 490] = img[y0 + 419, x0:x0 + 490] = (218, 220, 226)
        img[y0:y0 + 420, x0] = img[y0:y0 + 420, x0 + 489] = (218, 220, 226)
        text(x0 + 20, y0 + 24, 450, 3 if i else 2, (30, 30, 36))
        if i == 0:  # a photo
            img[y0 + 80:y0 + 340, x0 + 20:x0 + 470] = photo(rng, 450, 260)
        else:
            text(x0 + 20, y0 + 110, 450, 11, (70, 72, 80))
        ramp = np.linspace(0, 1, 36)[:, None, None]  # a button with a vertical gradient
        img[y0 + 360:y0 + 396, x0 + 20:x0 + 180] = (ramp * np.array([30, 90, 200]) + (1 - ramp) * np.array([80, 150, 250])).astype(np.uint8)
    for k in range(40):  # thin diagonal lines: aliasing
        x = 1100 + 15 * k
        for t in range(300):
            if 0 <= 1050 - t < h and x + t // 3 < w:
                img[1050 - t, x + t // 3] = (200, 40, 40)
    return img


def photo(rng, w, h):
    """Smooth colour fields, a sharp-edged disc and a one-pixel checkerboard (the highest frequency)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    phase = rng.uniform(0, 6.3, 3)
    r = 128 + 90 * np.sin(xx / 19.0 + yy / 41.0 + phase[0])
    g = 100 + 80 * np.cos(yy / 13.0 + phase[1]) * np.sin(xx / 57.0)
    b = 60 + 150 * (xx + yy) / (w + h) + 20 * np.sin(phase[2] + xx / 7.0)
    img = np.stack([r, g, b], -1)
    disc = (xx - w * 0.6) ** 2 + (yy - h * 0.4) ** 2 < (min(w, h) * 0.2) ** 2
    img[disc] = (250, 220, 40)
    checker = ((xx + yy) % 2 == 0) & (xx < min(w, 16)) & (yy < min(h, 16))
    img[checker] = 0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def make_images(out_dir):
    """Writes the images; returns [(file, config name, lossless)]."""
    rng = np.random.default_rng(20240527)
    entries = []

    def save(im, name, configs=("qwen3.5",), lossless=None, **kw):
        im.save(os.path.join(out_dir, name), **kw)
        fmt = name.rsplit(".", 1)[1]
        for c in configs:
            entries.append((name, c, fmt == "png" if lossless is None else lossless))

    ui = screenshot(rng)
    save(Image.fromarray(ui), "ui_1920x1080.png", ("qwen3.5", "small"), optimize=True)
    ph = photo(rng, 333, 517)
    save(Image.fromarray(ph), "photo_333x517.png", ("qwen3.5", "small"), optimize=True)
    save(Image.fromarray(ph), "photo_333x517.lossless.webp", lossless=True, quality=100)
    save(Image.fromarray(ph), "photo_333x517.jpg", quality=90)
    save(Image.fromarray(ph), "photo_333x517.lossy.webp", lossless=False, quality=80)
    save(Image.fromarray(photo(rng, 64, 48)), "small_64x48.png", optimize=True)
    save(Image.fromarray(photo(rng, 40, 2000)), "tall_40x2000.png", optimize=True)

    rgba = np.dstack([photo(rng, 200, 150), np.tile(np.linspace(0, 255, 200).astype(np.uint8), (150, 1))])
    rgba[:20, :, 3] = 0  # fully transparent rows with colour under them
    save(Image.fromarray(rgba, "RGBA"), "alpha_200x150.png", optimize=True)
    try:
        save(Image.fromarray(rgba, "RGBA"), "alpha_200x150.webp", lossless=True, exact=True, quality=100)
    except TypeError:  # a Pillow without exact=: skip the file rather than write an inexact one
        pass
    save(Image.fromarray(photo(rng, 300, 200)[:, :, 1]), "grey_300x200.png", optimize=True)
    save(Image.fromarray(photo(rng, 300, 200)[:, :, 0]), "grey_300x200.jpg", quality=85)
    pal = Image.fromarray(ui[100:260, 280:520]).quantize(colors=16, method=Image.Quantize.MEDIANCUT,
                                                         dither=Image.Dither.NONE)
    save(pal, "palette_240x160.png", transparency=0, optimize=True)
    g16 = (np.mgrid[0:80, 0:100][1] * 40 + np.mgrid[0:80, 0:100][0] * 3).astype(np.uint16)  # 0..4200: many over 255
    save(Image.fromarray(g16), "grey16_100x80.png")
    save(Image.fromarray(photo(rng, 120, 90)).convert("CMYK"), "cmyk_120x90.jpg", quality=90)
    return entries


# ---- the processor ----


def load_processors():
    """{config name: (processor, how it was built)} through AutoImageProcessor, as a checkpoint loads."""
    from transformers import AutoImageProcessor

    made = {}
    for name, cfg in CONFIGS.items():
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
                json.dump(cfg, f)
            try:
                proc = AutoImageProcessor.from_pretrained(d)
                how = "AutoImageProcessor.from_pretrained"
            except Exception as e:  # noqa: BLE001 - fall back to the class itself and say so
                from transformers import Qwen2VLImageProcessor

                kw = {k: v for k, v in cfg.items() if k not in ("processor_class", "image_processor_type")}
                proc = Qwen2VLImageProcessor(**kw)
                how = f"Qwen2VLImageProcessor(**config) (AutoImageProcessor failed: {e})"
        made[name] = (proc, how)
    return made


def load_pil_processors():
    try:
        from transformers import Qwen2VLImageProcessorPil
    except ImportError:
        return {}
    out = {}
    for name, cfg in CONFIGS.items():
        kw = {k: v for k, v in cfg.items() if k not in ("processor_class", "image_processor_type")}
        out[name] = Qwen2VLImageProcessorPil(**kw)
    return out


def run(proc, im):
    out = proc(images=[im], return_tensors="pt")
    pv = out["pixel_values"]
    grid = out["image_grid_thw"][0].tolist()
    return pv.detach().cpu().float().numpy(), [int(g) for g in grid]


def grid_sizes():
    sizes = [(1920, 1080), (1920, 1088), (64, 48), (333, 517), (1, 1), (2000, 10), (3000, 16), (80, 80), (48, 48),
             (1280, 720), (4000, 4000), (4100, 4100), (5000, 3000), (1366, 768), (3840, 2160), (400, 65535 // 2),
             (1, 200), (200, 1), (1, 201), (20001, 100), (25, 5000), (720, 400), (720, 432), (1000, 1000),
             (400, 496), (390, 844), (1440, 900), (2560, 1440), (1024, 768), (800, 600)]
    rng = np.random.default_rng(7)
    while len(sizes) < 60:
        w, h = int(rng.integers(1, 6000)), int(rng.integers(1, 6000))
        if w * h <= 18_000_000:
            sizes.append((w, h))
    return sizes


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tools/make_image_fixtures.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)

    import torch
    import torchvision
    import transformers

    versions = {
        "python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
        "transformers": transformers.__version__, "PIL": PIL.__version__, "numpy": np.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
    }
    procs = load_processors()
    pil_procs = load_pil_processors()
    fixture = {
        "generator": "tools/make_image_fixtures.py",
        "versions": versions,
        "configs": CONFIGS,
        "processor": {n: {"class": type(p).__name__, "backend": str(getattr(p, "backend", "?")), "built_by": how}
                      for n, (p, how) in procs.items()},
        "grids": [],
        "images": [],
    }

    for name in CONFIGS:
        proc = procs[name][0]
        for w, h in grid_sizes():
            entry = {"config": name, "width": w, "height": h}
            try:
                _, grid = run(proc, Image.new("RGB", (w, h)))
                entry["grid"] = grid
            except Exception as e:  # noqa: BLE001 - the reference raising is the expected answer
                entry["error"] = f"{type(e).__name__}: {e}"[:200]
            fixture["grids"].append(entry)

    for file, cfg_name, lossless in make_images(out_dir):
        path = os.path.join(out_dir, file)
        with Image.open(path) as im:
            im.load()
            mode = im.mode
            rgb = np.asarray(im.convert("RGB"))
            pv, grid = run(procs[cfg_name][0], im)
            pil_diff = None
            if cfg_name in pil_procs:
                pv_pil, _ = run(pil_procs[cfg_name], im)
                if pv_pil.shape == pv.shape:
                    pil_diff = float(np.abs(pv_pil - pv).max())
        flat_rgb = rgb.reshape(-1)
        rgb_stride = max(1, flat_rgb.size // MAX_RGB_SAMPLES) | 1
        flat = pv.reshape(-1)
        pv_stride = PV_STRIDE * max(1, math.ceil(flat.size / (PV_STRIDE * MAX_PV_SAMPLES)))
        fixture["images"].append({
            "file": file, "config": cfg_name, "mode": mode, "lossless": lossless,
            "width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
            "rgb_blake2b": blake2b_128(flat_rgb.tobytes()),
            "rgb_stride": int(rgb_stride), "rgb_samples": [int(v) for v in flat_rgb[::rgb_stride]],
            "grid": grid, "shape": [int(pv.shape[0]), int(pv.shape[1])],
            "pv_blake2b": blake2b_128(pv.astype("<f4").tobytes()),
            "pv_sum": float(pv.astype(np.float64).sum()), "pv_abs_sum": float(np.abs(pv.astype(np.float64)).sum()),
            "pv_stride": int(pv_stride), "pv_samples": [short(v) for v in flat[::pv_stride]],
            "first_patch": [short(v) for v in pv[0]] if cfg_name == "qwen3.5" else [],
            "last_patch": [short(v) for v in pv[-1]] if cfg_name == "qwen3.5" else [],
            "pil_backend_max_abs_diff": pil_diff,
        })
        print(f"{file:24s} {cfg_name:8s} {mode:5s} grid {grid} pv {list(pv.shape)} PIL backend diff {pil_diff}")

    with open(os.path.join(out_dir, "fixture.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir))
    print(f"wrote {len(fixture['images'])} image entries, {len(fixture['grids'])} grids: {total / 1e6:.2f} MB in {out_dir}")
    print(json.dumps(fixture["processor"]), json.dumps(versions))


if __name__ == "__main__":
    main()
