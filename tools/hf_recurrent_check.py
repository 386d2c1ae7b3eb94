#!/usr/bin/env python3
"""hf_recurrent_check.py — transformers' answers on rows with its two pure-PyTorch delta rules.

    python3 tools/hf_recurrent_check.py --model DIR --rows ROWS.jsonl [--device cuda]

transformers runs the Gated DeltaNet with flash-linear-attention's kernels when installed, else
with torch_chunk_gated_delta_rule (blocks of 64 tokens); torch_recurrent_gated_delta_rule is the
token-by-token form, the oracle of docs/design.md section 4. This prints, per row, the letter probabilities (fp32
forward, TF32 off) with each form, so a disagreement between squad and transformers can be
placed: if squad matches the recurrent form and not the chunked one, the chunked form is what
departs from the math on that model.
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def answers(model, row, device):
    ids = torch.tensor([row["ids"]], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    out = []
    for s, n in zip(row["slots"], row["nopts"]):
        out.append(torch.softmax(logits[s, row["letters"][:n]], -1).tolist())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device).eval()
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    gdn = [m for m in model.modules() if "GatedDeltaNet" in type(m).__name__]
    mod = __import__(type(gdn[0]).__module__, fromlist=["x"])
    recurrent = mod.torch_recurrent_gated_delta_rule

    def recurrent_rule(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                       **kw):
        return recurrent(q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    # the delta rule is reached through an instance attribute or a module-level name, depending on the version
    inst = [n for n in dir(gdn[0]) if "gated_delta_rule" in n and callable(getattr(gdn[0], n, None))]
    glob = [n for n in dir(mod) if "chunk_gated_delta_rule" in n and callable(getattr(mod, n))]
    saved_inst = [{n: getattr(m, n) for n in inst} for m in gdn]
    saved_glob = {n: getattr(mod, n) for n in glob}
    print(json.dumps({"gdn_layers": len(gdn), "instance_attrs": inst, "module_names": glob}), flush=True)

    def use(recurrent_form):
        for m, sv in zip(gdn, saved_inst):
            for n in inst:
                setattr(m, n, recurrent_rule if recurrent_form else sv[n])
        for n in glob:
            setattr(mod, n, recurrent_rule if recurrent_form else saved_glob[n])

    for i, row in enumerate(rows):
        use(False)
        p_chunk = answers(model, row, a.device)
        use(True)
        p_rec = answers(model, row, a.device)
        print(json.dumps({"row": i, "tokens": len(row["ids"]), "chunked": p_chunk, "recurrent": p_rec}), flush=True)


if __name__ == "__main__":
    main()
