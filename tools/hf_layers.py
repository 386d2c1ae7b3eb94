#!/usr/bin/env python3
"""hf_layers.py — transformers' residual stream, layer by layer, at the last position of one row.

    python3 tools/hf_layers.py --model DIR --row ROW.json --out FILE.json [--device cuda|cpu]

For localising a disagreement between squad and transformers: runs the row in float32 (TF32 off)
with output_hidden_states and writes, for each entry of hidden_states (the embedding, then the
residual after each layer; transformers' last entry is the final-norm output), the vector at the
last position, plus the letter probabilities at the slot and the config transformers resolved.
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--row", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    row = json.loads(open(a.row).readline())
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device).eval()
    ids = torch.tensor([row["ids"]], device=a.device)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    slot = row["slots"][0]
    hs = [h[0, slot].double().cpu().tolist() for h in out.hidden_states]
    lg = out.logits[0, slot, row["letters"][: row["nopts"][0]]].double()
    probs = torch.softmax(lg, -1).tolist()
    cfg = model.config.to_dict()
    json.dump({"hidden": hs, "probs": probs, "config": {k: str(v) for k, v in cfg.items()}}, open(a.out, "w"))
    print("transformers fp32 probs", probs)
    for i, h in enumerate(hs):
        t = torch.tensor(h)
        print(f"hidden[{i:2d}] norm {t.norm():.6f} first {[round(x, 5) for x in h[:4]]}")


if __name__ == "__main__":
    main()
