#!/usr/bin/env python3
"""Reference fixtures for squad's specialists (docs/specialists.md), made with transformers + peft.

What it writes (under --out DIR; copy DIR/* into tests/fixtures/specialists/):
  base/                  a random Qwen3_5ForCausalLM (6 layers [lin lin lin full lin full], H 64,
                         tied), saved with save_pretrained in bf16.
  specialists/           a specialists directory for that model:
      squad-specialists.json   router layer 2, split 3, labels ["trunk", "e2e", "nav"]
      router.safetensors       weight [3, 64], bias [3] (F32), fitted so routes spread (below)
      e2e/, nav/               PEFT LoRA adapters saved by peft's save_pretrained: every projection
                               of layers 3-5 (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
                               out_proj, q/k/v/o_proj, gate/up/down_proj), non-zero lora_B;
                               e2e: r 4, lora_alpha 8; nav: r 8, lora_alpha 6, use_rslora.
  rows.jsonl             docs/design.md section 5 rows: independent rows of several lengths, and a
                         family sharing one 320-token state (state_len 320) whose questions route
                         to each label in turn, plus that state grown by 40 tokens: the cache's
                         guessed-route and two-pass scenarios.
  expected.jsonl         per row: "route" (label), "route_index", "router_logits", "router_probs"
                         (softmax of the logits), "probs" (the answer under the route) and
                         "probs_by_route" (the answer under each label, for rows forced to a
                         specialist).
  manifest.json          versions, seeds, the router's margins, cross-checks, the saved adapter
                         keys and adapter_config.json as peft wrote them.

How the reference is computed: every number comes from the SAVED files. The base weights (bf16
files) and the adapters (peft's files) are read as float64; a route's model is the base with
W + s B A merged into each adapted projection (s = lora_alpha / r, or lora_alpha / sqrt(r) with
use_rslora, read from adapter_config.json), run through tools/make_fixtures.py's independent
float64 implementation of docs/design.md section 4 (per-token delta-rule recurrence). The router's
features are the mean over the row's tokens of x / sqrt(mean(x^2) + eps), x the float64 hidden
state entering layer 2 (the output of layer 1). The route is the argmax of weight . f + bias.
As cross-checks, transformers' own forward (float32, eager, CPU) with peft's PeftModel loaded
from the saved adapter is compared with the float64 answers, and the features with transformers'
hidden_states; the largest differences go into manifest.json.

The router: rows are assigned a label in turn (trunk, e2e, nav, ...); weight and bias are the
minimum-norm least-squares solution of [f, 1] . [weight | bias]^T = MARGIN * (onehot - 1/3) over
all rows (exact while rows <= H + 1), so every label gets rows and every route wins by MARGIN logits
in float64. manifest.json reports the smallest margin and the weight's norm (a float32 engine's
logits differ from these by about |weight| x |feature error|, far below the margin).

Run on the GPU machine's Python (torch, transformers >= 5 with Qwen3.5, peft, safetensors, numpy);
everything runs on the CPU in one thread order, so it is deterministic for given versions:
    python3 tools/make_specialist_fixtures.py --out DIR
It exits 1 (and says why) when peft saves keys squad's loader does not map, when a route gets no
rows, or when a cross-check is off by more than its tolerance.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as MF  # noqa: E402  (the base-model recipe and the float64 oracle)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

LIN, FULL = MF.LIN, MF.FULL
T0 = time.time()

BASE = dict(
    cls="causal", seed=515, tied=True,
    text=dict(hidden_size=64, num_hidden_layers=6, layer_types=[LIN, LIN, LIN, FULL, LIN, FULL],
              intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=300, rms_norm_eps=1e-6,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}),
)
OUT_FACTOR = 1.4  # output-embedding scale (tools/make_fixtures.py's calibration for this size)
ROUTER_LAYER, SPLIT, ROUTER_EPS = 2, 3, 1e-6
LABELS = ["trunk", "e2e", "nav"]
ADAPTERS = {
    "e2e": dict(r=4, alpha=8.0, rslora=False, seed=61),
    "nav": dict(r=8, alpha=6.0, rslora=True, seed=62),
}
TARGETS = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj",
           "o_proj", "gate_proj", "up_proj", "down_proj"]
B_SCALE = 0.5  # lora_B ~ N(0, (B_SCALE / r)^2): peft starts B at zero; the fixtures need it non-zero
MARGIN = 4.0  # router logit margin of every row's route
ROW_SEED = 5150
INDEPENDENT_LENGTHS = [3, 17, 64, 65, 130, 257, 300, 333, 410]
STATE_LEN, GROW = 320, 40
HF_TOL = 2e-3  # float32 transformers + peft against the float64 reference (probabilities)

KEY_RE = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(linear_attn\.(in_proj_qkv|in_proj_z|in_proj_b|"
                    r"in_proj_a|out_proj)|self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.lora_[AB]\.weight$")


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# --------------------------------------------------------------------------------------------
# The base model and the adapters
# --------------------------------------------------------------------------------------------
def load_causal(d, dtype):
    try:
        return MF.Qwen3_5ForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager").eval()
    except TypeError:
        return MF.Qwen3_5ForCausalLM.from_pretrained(d, torch_dtype=dtype, attn_implementation="eager").eval()


def make_base(out):
    d = os.path.join(out, "base")
    torch.manual_seed(BASE["seed"])
    model = MF.model_class(BASE)(MF.make_config(BASE)).eval()
    MF.redraw(model, BASE, BASE["seed"], OUT_FACTOR)
    model = model.to(torch.bfloat16)
    model.save_pretrained(d)
    return d


def make_adapter(base_dir, out, label, spec):
    d = os.path.join(out, "specialists", label)
    model = load_causal(base_dir, torch.float32)
    n = BASE["text"]["num_hidden_layers"]
    cfg = LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], use_rslora=spec["rslora"], target_modules=TARGETS,
                     layers_to_transform=list(range(SPLIT, n)), lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters()):
            if ".lora_A." in name:
                p.copy_(torch.randn(tuple(p.shape), generator=g) / math.sqrt(p.shape[1]))
            elif ".lora_B." in name:
                p.copy_(torch.randn(tuple(p.shape), generator=g) * (B_SCALE / spec["r"]))
    pm.save_pretrained(d)
    keys = sorted(load_file(os.path.join(d, "adapter_model.safetensors")).keys())
    bad = [k for k in keys if not KEY_RE.match(k) or int(KEY_RE.match(k).group(1)) < SPLIT]
    if bad:
        raise SystemExit(f"{label}: peft saved keys squad does not map (or below split {SPLIT}): {bad[:5]}")
    with open(os.path.join(d, "adapter_config.json")) as f:
        acfg = json.load(f)
    return d, keys, acfg


# --------------------------------------------------------------------------------------------
# Float64 reference from the saved files
# --------------------------------------------------------------------------------------------
def base_sd64(base_dir):
    sd = {}
    for fn in sorted(os.listdir(base_dir)):
        if fn.endswith(".safetensors"):
            sd.update({k: v.double() for k, v in load_file(os.path.join(base_dir, fn)).items()})
    return sd


def merged_sd64(sd, adapter_dir):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    r, alpha = acfg["r"], acfg["lora_alpha"]
    s = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    ad = {k: v.double() for k, v in load_file(os.path.join(adapter_dir, "adapter_model.safetensors")).items()}
    out = dict(sd)
    for k, a in ad.items():
        if not k.endswith(".lora_A.weight"):
            continue
        b = ad[k.replace(".lora_A.", ".lora_B.")]
        wkey = k[len("base_model.model."):-len(".lora_A.weight")] + ".weight"
        out[wkey] = out[wkey] + s * (b @ a)
    return out, s


def answer64(sd, row):
    hn, hiddens, _ = MF.oracle(sd, BASE, row["ids"])
    out_w = sd["model.embed_tokens.weight"]
    probs = []
    for s, n in zip(row["slots"], row["nopts"]):
        z = out_w[row["letters"][:n]] @ hn[s]
        probs.append(torch.softmax(z, 0).tolist())
    return probs, hiddens


def features64(hiddens):
    x = hiddens[ROUTER_LAYER - 1]  # the output of layer ROUTER_LAYER - 1 enters layer ROUTER_LAYER
    return (x / torch.sqrt((x * x).mean(-1, keepdim=True) + ROUTER_EPS)).mean(0)


# --------------------------------------------------------------------------------------------
# Rows and the router
# --------------------------------------------------------------------------------------------
def make_rows():
    rng = np.random.default_rng(ROW_SEED)
    V = BASE["text"]["vocab_size"]

    def toks(n):
        return [int(x) for x in rng.integers(0, V, size=n)]

    def row(state, suffix, label, with_state=True):
        ids = state + suffix
        letters = [int(x) for x in rng.choice(V, size=int(rng.integers(4, 7)), replace=False)]
        slots = sorted({len(ids) - 1} | ({len(state) + len(suffix) // 2} if len(suffix) > 4 else set()))
        nopts = [int(rng.integers(2, len(letters) + 1)) for _ in slots]
        r = {"ids": ids, "slots": slots, "nopts": nopts, "letters": letters}
        if with_state:
            r["state_len"] = len(state)
        return r, label

    rows = []
    for i, L in enumerate(INDEPENDENT_LENGTHS):
        cut = max(0, L - 12)
        ids = toks(L)
        rows.append(row(ids[:cut], ids[cut:], f"independent {L} tokens", with_state=i % 4 != 1))
    S = toks(STATE_LEN)
    for j in range(4):
        rows.append(row(S, toks(14 + 5 * j), f"shared state {STATE_LEN}, question {j}"))
    grown = S + toks(GROW)
    rows.append(row(grown, toks(18), f"shared state grown to {STATE_LEN + GROW}"))
    return rows


def fit_router(feats):
    """Rows take labels in turn; weight and bias solve [f, 1] W^T = MARGIN (onehot - 1/R) exactly."""
    N, H = feats.shape
    R = len(LABELS)
    if N > H + 1:
        raise SystemExit(f"{N} rows cannot be fitted exactly by a router over {H} features")
    want = [i % R for i in range(N)]
    Y = np.full((N, R), -MARGIN / R)
    for i, k in enumerate(want):
        Y[i, k] += MARGIN
    X = np.concatenate([feats, np.ones((N, 1))], 1)
    Wb, *_ = np.linalg.lstsq(X, Y, rcond=None)  # [H + 1, R], minimum norm
    weight = np.ascontiguousarray(Wb[:H].T).astype(np.float32)
    bias = np.ascontiguousarray(Wb[H]).astype(np.float32)
    return weight, bias, want


def route64(weight, bias, f):
    z = weight.astype(np.float64) @ f + bias.astype(np.float64)
    p = np.exp(z - z.max())
    return int(np.argmax(z)), z, p / p.sum()


# --------------------------------------------------------------------------------------------
# Cross-check: transformers + peft in float32 from the saved files
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def hf_check(base_dir, adapter_dirs, rows, expected, feats):
    worst_p, worst_f = 0.0, 0.0
    base = load_causal(base_dir, torch.float32)
    for i, row in enumerate(rows):
        out = base(input_ids=torch.tensor([row["ids"]]), output_hidden_states=True, use_cache=False)
        x = out.hidden_states[ROUTER_LAYER][0].double()  # hidden_states[0] is the embedding output
        f = (x / torch.sqrt((x * x).mean(-1, keepdim=True) + ROUTER_EPS)).mean(0).numpy()
        worst_f = max(worst_f, float(np.abs(f - feats[i]).max()))
        lg = out.logits[0].double()
        for s, n, ref in zip(row["slots"], row["nopts"], expected[i]["probs_by_route"]["trunk"]):
            p = torch.softmax(lg[s, row["letters"][:n]], 0).tolist()
            worst_p = max(worst_p, max(abs(a - b) for a, b in zip(p, ref)))
    for label, d in adapter_dirs.items():
        pm = PeftModel.from_pretrained(load_causal(base_dir, torch.float32), d).eval()
        for i, row in enumerate(rows):
            lg = pm(input_ids=torch.tensor([row["ids"]]), use_cache=False).logits[0].double()
            for s, n, ref in zip(row["slots"], row["nopts"], expected[i]["probs_by_route"][label]):
                p = torch.softmax(lg[s, row["letters"][:n]], 0).tolist()
                worst_p = max(worst_p, max(abs(a - b) for a, b in zip(p, ref)))
    return worst_p, worst_f


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    os.makedirs(os.path.join(args.out, "specialists"), exist_ok=True)

    base_dir = make_base(args.out)
    log("base saved")
    adapter_dirs, saved = {}, {}
    for label, spec in ADAPTERS.items():
        d, keys, acfg = make_adapter(base_dir, args.out, label, spec)
        adapter_dirs[label] = d
        saved[label] = {"keys": keys, "adapter_config": acfg}
        log(f"adapter {label}: {len(keys)} tensors")

    sd = base_sd64(base_dir)
    merged = {"trunk": (sd, 0.0)}
    for label, d in adapter_dirs.items():
        merged[label] = merged_sd64(sd, d)

    rows_l = make_rows()
    rows = [r for r, _ in rows_l]
    probs_by_route = [dict() for _ in rows]
    feats = np.zeros((len(rows), BASE["text"]["hidden_size"]))
    for i, row in enumerate(rows):
        for label in LABELS:
            p, hiddens = answer64(merged[label][0], row)
            probs_by_route[i][label] = p
            if label == "trunk":
                feats[i] = features64(hiddens).numpy()
        log(f"row {i}: {len(row['ids'])} tokens")

    weight, bias, want = fit_router(feats)
    save_file({"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)},
              os.path.join(args.out, "specialists", "router.safetensors"))
    spec = {"router": {"file": "router.safetensors", "layer": ROUTER_LAYER, "features": "rmsnorm",
                       "eps": ROUTER_EPS, "labels": LABELS},
            "split": SPLIT, "specialists": {label: label for label in ADAPTERS}}
    with open(os.path.join(args.out, "specialists", "squad-specialists.json"), "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")

    expected, margins = [], []
    for i, row in enumerate(rows):
        k, z, p = route64(weight, bias, feats[i])
        if k != want[i]:
            raise SystemExit(f"row {i}: the fitted router gives {LABELS[k]}, not {LABELS[want[i]]}")
        margins.append(float(z[k] - np.max(np.delete(z, k))))
        expected.append({"route": LABELS[k], "route_index": k, "router_logits": z.tolist(),
                         "router_probs": p.tolist(), "probs": probs_by_route[i][LABELS[k]],
                         "probs_by_route": probs_by_route[i]})
    counts = {label: sum(e["route"] == label for e in expected) for label in LABELS}
    if min(counts.values()) < 2:
        raise SystemExit(f"routes do not spread: {counts}")

    with open(os.path.join(args.out, "rows.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    with open(os.path.join(args.out, "expected.jsonl"), "w") as f:
        for e in expected:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")

    hf_p, hf_f = hf_check(base_dir, adapter_dirs, rows, expected, feats)
    log(f"cross-check: transformers+peft float32 vs float64 max prob diff {hf_p:.2e}, features {hf_f:.2e}")
    # how much an adapter moves the answers (the fixtures must tell the routes apart)
    moved = max(abs(a - b) for e in expected for lab in ADAPTERS
                for sa, sb in zip(e["probs_by_route"][lab], e["probs_by_route"]["trunk"]) for a, b in zip(sa, sb))
    manifest = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": peft.__version__, "numpy": np.__version__, "platform": platform.platform(),
        "base": BASE, "out_factor": OUT_FACTOR, "router_layer": ROUTER_LAYER, "split": SPLIT,
        "adapters": ADAPTERS, "scales": {label: merged[label][1] for label in ADAPTERS}, "b_scale": B_SCALE,
        "rows": [{"label": lab, "tokens": len(r["ids"]), "route": e["route"]} for (r, lab), e in zip(rows_l, expected)],
        "route_counts": counts, "router_margin_target": MARGIN, "router_min_margin": min(margins),
        "router_weight_max_row_norm": float(np.linalg.norm(weight, axis=1).max()),
        "max_prob_change_by_an_adapter": moved,
        "hf_peft_float32_max_prob_diff": hf_p, "hf_features_max_abs_diff": hf_f, "saved": saved,
        "seconds": round(time.time() - T0, 1),
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    log(f"routes {counts}, min margin {min(margins):.3f}, adapters move probabilities by up to {moved:.3f}")
    if hf_p > HF_TOL:
        print(f"FAIL: transformers+peft differs from the float64 reference by {hf_p:.2e} > {HF_TOL}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
