#!/usr/bin/env python3
"""make_vision_fixtures.py — reference fixtures for squad's vision tower (src/cpu/vision.c) and, for
the work that follows it, the letter probabilities of rows with images, made with transformers' own
Qwen3_5ForConditionalGeneration on a tiny-vl checkpoint written by `squad synth`.

    squad synth --preset tiny-vl --out CKPT --tokenizer third_party/qwen3/tokenizer.json
    python3 tools/make_vision_fixtures.py CKPT OUT_DIR [IMAGES_DIR]

(OUT_DIR e.g. tests/fixtures/vision/; IMAGES_DIR defaults to tests/fixtures/images/, the committed
processor fixtures.) Needs PyTorch, transformers 5.x, Pillow and numpy; no network, no GPU (the model
is tiny and runs in float32 on the CPU, attention "eager", so nothing depends on TF32 or kernels).
Only CKPT's config.json, model.safetensors and preprocessor_config.json are read; its tokenizer.json
is not needed (rows are token ids).

It writes OUT_DIR/fixture.json:
  - versions, the command, the checkpoint's identity (BLAKE2b-128 of config.json and of
    model.safetensors: tests/test_vision.c regenerates the checkpoint and checks it is the same);
  - processor: the class AutoImageProcessor built from the checkpoint's preprocessor_config.json;
  - towers: per image, the grid, pixel_values' shape and BLAKE2b-128 (float32 little-endian bytes),
    and `model.model.visual(pixel_values, grid_thw=...)`'s merged output (pooler_output in
    transformers 5.x): its shape, float64 sum and sum of absolute values, every value to 7
    significant digits;
  - rows: rows with images in the format of tests/fixtures/models/*/rows.jsonl (ids holding each
    image's expanded run: <|vision_start|>, one <|image_pad|> per merged token, <|vision_end|>;
    slots, nopts, letters) plus the images (file names, in order) and their grids, the M-RoPE
    position ids transformers computes for the row (get_rope_index, when its signature allows) and
    probs: for each slot softmax(logits[slot, letters[:nopts]]) in float64, logits from the whole
    model's forward with the processor's pixel_values in float32.
Deterministic (fixed seeds, CPU float32); two runs write the same file.
"""
import hashlib
import json
import os
import platform
import sys

import numpy as np
from PIL import Image

# The images (from the committed processor fixtures) whose towers are recorded: a tiny one (a 4x4
# grid: the position table's own size), a tall photo (8x6: interpolation and rows != columns), an
# RGBA one (alpha dropped by the processor).
TOWER_IMAGES = ["small_64x48.png", "photo_333x517.png", "alpha_200x150.png"]
ROW_SEED = 20261202


def blake2b_128(data):
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_blake2b(path):
    with open(path, "rb") as f:
        return blake2b_128(f.read())


def g7(x):
    return float(f"{float(x):.7g}")


def load_model(ckpt):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration
    try:
        model = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # older spelling of the dtype argument
        model = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, torch_dtype=torch.float32,
                                                                attn_implementation="eager")
    model.eval()
    return model


def tower_output(model, pv, grid):
    """The merged embeddings [tokens, out_hidden] of model.model.visual (5.x returns a
    BaseModelOutputWithPooling whose pooler_output holds them; older versions a tensor)."""
    out = model.model.visual(pv, grid_thw=grid)
    if hasattr(out, "pooler_output") and out.pooler_output is not None:
        return out.pooler_output
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def image_run(cfg, n_tokens):
    return [cfg["vision_start_token_id"]] + [cfg["image_token_id"]] * n_tokens + [cfg["vision_end_token_id"]]


def make_rows(cfg, grids, merge, rng):
    """Rows with images: an image inside text, a state that starts with an image, two images."""
    text_vocab = min(cfg["vision_start_token_id"], cfg["text_config"]["vocab_size"])  # ids below the specials

    def toks(n):
        return [int(x) for x in rng.integers(0, text_vocab, size=n)]

    def tokens_of(name):
        t, h, w = grids[name]
        return t * (h // merge) * (w // merge)

    rows = []
    plans = [
        (["small_64x48.png"], lambda runs: toks(5) + runs[0] + toks(9)),
        (["photo_333x517.png"], lambda runs: runs[0] + toks(12)),
        (["small_64x48.png", "photo_333x517.png"], lambda runs: toks(3) + runs[0] + toks(4) + runs[1] + toks(6)),
    ]
    for images, layout in plans:
        runs = [image_run(cfg, tokens_of(name)) for name in images]
        ids = layout(runs)
        first_image = ids.index(cfg["vision_start_token_id"])
        # A slot before the first image (when there is text there), one right after the last image's
        # end, and the last position.
        last_end = len(ids) - 1 - ids[::-1].index(cfg["vision_end_token_id"])
        slots = sorted({s for s in (first_image - 1, last_end + 1, len(ids) - 1) if 0 <= s < len(ids)})
        letters = [int(x) for x in rng.choice(text_vocab, size=5, replace=False)]
        nopts = [int(rng.integers(2, 6)) for _ in slots]
        rows.append({"ids": ids, "images": images, "grids": [grids[n] for n in images], "slots": slots,
                     "nopts": nopts, "letters": letters})
    return rows


def mm_types(model, ids):
    """The processor's mm_token_type_ids for a row of ids: 1 at image pads, 0 elsewhere."""
    return (ids == model.config.image_token_id).long()


def rope_index(model, ids, grid_thw):
    """transformers' M-RoPE positions [3][len] for a row, or None when the call's signature differs."""
    import torch
    try:
        ids_t = torch.tensor([ids])
        try:  # 5.17 asks for the token types (0 text, 1 image) beside the ids
            pos, _ = model.model.get_rope_index(ids_t, image_grid_thw=grid_thw, mm_token_type_ids=mm_types(model, ids_t))
        except TypeError:
            pos, _ = model.model.get_rope_index(ids_t, image_grid_thw=grid_thw)
        return pos[:, 0, :].tolist()
    except Exception as e:  # noqa: BLE001 -- the signature moved between 5.x releases
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python3 tools/make_vision_fixtures.py CKPT OUT_DIR [IMAGES_DIR]")
    ckpt, out_dir = sys.argv[1], sys.argv[2]
    images_dir = sys.argv[3] if len(sys.argv) == 4 else os.path.join("tests", "fixtures", "images")
    os.makedirs(out_dir, exist_ok=True)

    import torch
    import transformers
    from transformers import AutoImageProcessor

    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    merge = cfg["vision_config"]["spatial_merge_size"]
    proc = AutoImageProcessor.from_pretrained(ckpt)
    model = load_model(ckpt)

    fixture = {
        "generator": "tools/make_vision_fixtures.py",
        "command": "squad synth --preset tiny-vl --out CKPT --tokenizer third_party/qwen3/tokenizer.json",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "checkpoint": {"config_blake2b": file_blake2b(os.path.join(ckpt, "config.json")),
                       "weights_blake2b": file_blake2b(os.path.join(ckpt, "model.safetensors"))},
        "processor": {"class": type(proc).__name__, "backend": str(getattr(proc, "backend", "?"))},
        "model": {"class": type(model).__name__, "attn_implementation": "eager", "dtype": "float32"},
        "towers": [],
        "rows": [],
    }

    pixel_values, grids = {}, {}
    for name in TOWER_IMAGES:
        im = Image.open(os.path.join(images_dir, name))
        out = proc(images=[im], return_tensors="pt")
        pv = out["pixel_values"].float()
        grid_thw = out["image_grid_thw"]
        grid = [int(g) for g in grid_thw[0].tolist()]
        pixel_values[name], grids[name] = (pv, grid_thw), grid
        emb = tower_output(model, pv, grid_thw).float()
        e64 = emb.double().numpy()
        fixture["towers"].append({
            "file": name, "grid": grid, "pv_shape": list(pv.shape),
            "pv_blake2b": blake2b_128(pv.numpy().astype("<f4").tobytes()),
            "shape": list(emb.shape), "sum": float(e64.sum()), "abs_sum": float(np.abs(e64).sum()),
            "values": [g7(x) for x in emb.reshape(-1).tolist()],
        })
        print(f"{name}: grid {grid}, tower output {list(emb.shape)}, sum {e64.sum():.6f}", file=sys.stderr)

    rng = np.random.default_rng(ROW_SEED)
    for row in make_rows(cfg, grids, merge, rng):
        pv = torch.cat([pixel_values[n][0] for n in row["images"]], dim=0)
        grid_thw = torch.cat([pixel_values[n][1] for n in row["images"]], dim=0)
        ids = torch.tensor([row["ids"]])
        logits = model(input_ids=ids, pixel_values=pv, image_grid_thw=grid_thw,
                       mm_token_type_ids=mm_types(model, ids)).logits[0].float()
        probs = []
        for s, n in zip(row["slots"], row["nopts"]):
            z = logits[s, row["letters"][:n]].double()
            probs.append(torch.softmax(z, dim=0).tolist())
        row["probs"] = probs
        row["mrope_positions"] = rope_index(model, row["ids"], grid_thw)
        fixture["rows"].append(row)
        print(f"row with {row['images']}: {len(row['ids'])} ids, probs {[[round(p, 4) for p in q] for q in probs]}",
              file=sys.stderr)

    path = os.path.join(out_dir, "fixture.json")
    with open(path, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
