#!/usr/bin/env python3
"""hf_vision_timing.py — transformers' own bf16 forward on the screenshot rows squad's bench ran.

    python3 tools/hf_vision_timing.py --model DIR --rows ROWS.jsonl [--reps N] [--out FILE.json]

The other side of bench/RESULTS.md's screenshot figures (issue 27): the same checkpoint (a
`Qwen3_5ForConditionalGeneration` with its vision tower, e.g. `squad synth --preset qwen3.5-0.8b
--vision`), the same images and the same token ids, through transformers in bf16 on CUDA with
whatever Gated DeltaNet kernels it finds (flash-linear-attention when importable: tools/gpu_run.sh
carries a copy in .fla/ for its hf_fla step, never committed).

ROWS.jsonl: one row per case, as bench/bench_vision.c writes them:
    {"case": "...", "kind": "tower" | "cold" | "hit", "ids": [...], "images": ["path", ...],
     "state_len": n, "slots": [...], "nopts": [...], "letters": [...], "probs": [[...], ...],
     "squad_ms": p50}
ids hold each image's expanded <|image_pad|> run. For each case this script
  - tower: times model.model.visual on the row's first image (the processor run once, untimed);
  - cold: times one forward of the whole row with its pixel values (tower included);
  - hit: runs the state [0, state_len) once (untimed) and times the question's forward on a copy of
    its cache, with the row's own M-RoPE positions (get_rope_index over the whole row), the work
    squad's follow-up question does;
and compares the letter probabilities at the slots with squad's (max absolute difference, argmax).
Times are CUDA-event medians of --reps after a warm-up.
"""
import argparse
import copy
import json
import sys
import time

from hf_timing import timed  # the same CUDA-event timer (tools/ is the script's own path)


def tower(model, pv, grid):
    out = model.model.visual(pv, grid_thw=grid)
    if hasattr(out, "pooler_output") and out.pooler_output is not None:
        return out.pooler_output
    return out[0] if isinstance(out, (tuple, list)) else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    import transformers
    from PIL import Image
    from transformers import AutoImageProcessor, Qwen3_5ForConditionalGeneration

    rows = [json.loads(l) for l in open(args.rows) if l.strip()]
    try:
        import fla  # noqa: F401
        gdn = "flash-linear-attention"
    except Exception:  # noqa: BLE001
        gdn = "PyTorch fallback (flash-linear-attention not installed)"
    t0 = time.time()
    model = Qwen3_5ForConditionalGeneration.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    proc = AutoImageProcessor.from_pretrained(args.model)
    image_token = model.config.image_token_id
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; loaded in {time.time() - t0:.1f} s; "
          f"GDN kernels: {gdn}; attention: {model.config.text_config._attn_implementation}", flush=True)

    def pixels(paths):
        out = proc(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt")
        return out["pixel_values"].to("cuda", torch.bfloat16), out["image_grid_thw"].to("cuda")

    def mm_types(ids):
        return (ids == image_token).long()

    def positions(ids, grid):
        try:
            pos, _ = model.model.get_rope_index(ids, image_grid_thw=grid, mm_token_type_ids=mm_types(ids))
        except TypeError:  # the signature moved between 5.x releases
            pos, _ = model.model.get_rope_index(ids, image_grid_thw=grid)
        return pos

    def letter_probs(logits, slots, nopts, letters):
        return [torch.softmax(logits[0, i, letters[:n]].double(), -1).tolist() for i, n in enumerate(nopts)]

    results = []
    with torch.no_grad():
        for r in rows:
            pv, grid = pixels(r["images"])
            ids = torch.tensor([r["ids"]], device="cuda")
            res = {"case": r["case"], "kind": r["kind"], "squad_ms": r.get("squad_ms")}
            if r["kind"] == "tower":
                grid1 = grid[:1]
                n_patch = int(grid1.prod())
                pv1 = pv[:n_patch]
                tower(model, pv1, grid1)
                res["hf_p50_ms"], res["hf_min_ms"] = timed(torch, lambda: None, lambda _: tower(model, pv1, grid1),
                                                           args.reps)
            elif r["kind"] == "cold":
                keep = torch.tensor(r["slots"], device="cuda")

                def run(_):
                    return model(input_ids=ids, pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=mm_types(ids),
                                 use_cache=False, logits_to_keep=keep).logits
                logits = run(None)
                res["hf_probs"] = letter_probs(logits, r["slots"], r["nopts"], r["letters"])
                res["hf_p50_ms"], res["hf_min_ms"] = timed(torch, lambda: None, run, args.reps)
            else:
                p = r["state_len"]
                pos = positions(ids, grid)
                state = model(input_ids=ids[:, :p], pixel_values=pv, image_grid_thw=grid,
                              mm_token_type_ids=mm_types(ids[:, :p]), position_ids=pos[..., :p], use_cache=True,
                              logits_to_keep=1).past_key_values
                keep = torch.tensor([s - p for s in r["slots"]], device="cuda")

                def run(cache):
                    return model(input_ids=ids[:, p:], past_key_values=cache, position_ids=pos[..., p:],
                                 use_cache=True, logits_to_keep=keep).logits
                logits = run(copy.deepcopy(state))
                res["hf_probs"] = letter_probs(logits, r["slots"], r["nopts"], r["letters"])
                res["hf_p50_ms"], res["hf_min_ms"] = timed(torch, lambda: copy.deepcopy(state), run, args.reps)
            if "hf_probs" in res and r.get("probs"):
                res["max_abs_prob_diff"] = max(abs(a - b) for hp, sp in zip(res["hf_probs"], r["probs"])
                                               for a, b in zip(hp, sp))
                res["same_argmax"] = all(max(range(len(hp)), key=hp.__getitem__) == max(range(len(sp)), key=sp.__getitem__)
                                         for hp, sp in zip(res["hf_probs"], r["probs"]))
            results.append(res)
            print(f"{r['case']:>24}: transformers p50 {res['hf_p50_ms']:9.2f} ms (min {res['hf_min_ms']:.2f})"
                  + (f"; |p_hf - p_squad| max {res['max_abs_prob_diff']:.2e}, argmax "
                     f"{'same' if res['same_argmax'] else 'DIFFERS'}" if "max_abs_prob_diff" in res else ""), flush=True)
    # the same rows once more in float32 (probabilities only, the whole row in one forward): the
    # reference that tells transformers' own bf16 noise apart from a difference in squad's arithmetic
    del model
    torch.cuda.empty_cache()
    try:
        m32 = Qwen3_5ForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            for r, x in zip(rows, results):
                if r["kind"] == "tower" or not r.get("probs"):
                    continue
                pv, grid = pixels(r["images"])
                ids = torch.tensor([r["ids"]], device="cuda")
                lg = m32(input_ids=ids, pixel_values=pv.float(), image_grid_thw=grid, mm_token_type_ids=mm_types(ids),
                         use_cache=False, logits_to_keep=torch.tensor(r["slots"], device="cuda")).logits
                p32 = letter_probs(lg, r["slots"], r["nopts"], r["letters"])
                for key, other in (("fp32_vs_squad", r["probs"]), ("fp32_vs_hf_bf16", x.get("hf_probs"))):
                    x[key] = max(abs(a - b) for hp, op in zip(p32, other or []) for a, b in zip(hp, op)) if other else None
                print(f"{r['case']:>24}: |p - p_fp32| max: squad bf16 {x['fp32_vs_squad']:.2e}, transformers bf16 "
                      f"{x['fp32_vs_hf_bf16']:.2e}", flush=True)
        del m32
    except Exception as e:  # noqa: BLE001
        print(f"float32 reference failed: {e}", flush=True)
    print("\n| case | transformers p50 ms | squad p50 ms | ratio | max abs prob diff | same argmax |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for x in results:
        sq = x["squad_ms"] or float("nan")
        print(f"| {x['case']} | {x['hf_p50_ms']:.2f} | {sq:.3f} | {x['hf_p50_ms'] / sq:.1f}x | "
              f"{x.get('max_abs_prob_diff', float('nan')):.2e} | {x.get('same_argmax', '-')} |")
    if args.out:
        json.dump({"gdn": gdn, "transformers": transformers.__version__, "torch": torch.__version__, "rows": results},
                  open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
