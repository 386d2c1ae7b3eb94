#!/usr/bin/env python3
"""Reference fixtures for squad's engine and cache tests, made with Hugging Face transformers.

What it writes (under --out DIR):
  models/<name>/            one folder per config (tiny-causal, tiny-cond-untied, small-mha):
      config.json, *.safetensors (bf16, from save_pretrained; tiny-cond-untied sharded with
      model.safetensors.index.json), rows.jsonl (docs/design.md section 5 rows), expected.jsonl
      ({"probs": [[...], ...]} per row: logits = model(ids).logits[0, slot, letters] in fp32,
      masked to the first nopts, softmax in float64).
  models/tiny-causal/cache_rows.jsonl, cache_expected.jsonl, cache_labels.txt
      a fixed agent-like row sequence with "state_len" (states with several questions, appended
      actions, changed middles, repeats, long states, interleaved unrelated states) and its
      uncached reference answers; cache_labels.txt says what each row is.
  models/tiny-causal/debug.json
      for row 3 (63 tokens): the hidden state at the last position after the embedding, after each
      decoder layer, each layer's mixer output, and after the final norm.
  qwen3.5-0.8b-tensors.json
      tensor names and shapes of transformers' own 0.8B text model (built on the meta device) in the
      Qwen3_5ForCausalLM layout and the Qwen3_5ForConditionalGeneration layout (text part only),
      as save_pretrained would write them (tied lm_head left out).
  manifest.json
      versions, date, per-config probability statistics, the independent-oracle comparison, the
      saved tensor names, and what was observed about transformers' Qwen3.5 implementation.

How the weights are made: each model is built from its config, every parameter is re-drawn from a
seeded torch.Generator (matrices N(0, 1/fan_in); zero-centred norms N(0, 0.2); the GDN gated-norm
weight 1 + N(0, 0.2); A_log = log of a log-uniform value in [0.02, 8]; dt_bias N(0, 0.5); conv1d
N(0, 0.5)); the output-embedding scale is calibrated so the answers are neither saturated nor
uniform; then model.to(bfloat16), save_pretrained, and the SAVED files are reloaded as float32 with
attn_implementation="eager" (CPU, pure-torch Gated DeltaNet path) for the reference forward. An
independent float64 re-implementation of docs/design.md section 4 (per-token delta-rule recurrence) is run
on every row as a cross-check and its largest probability difference is reported.

Run (needs torch, transformers >= 5 with Qwen3_5ForCausalLM, safetensors, numpy; no GPU needed):
    python3 tools/make_fixtures.py --out DIR
then copy DIR/models and DIR/qwen3.5-0.8b-tensors.json into tests/fixtures/. Deterministic: the same
versions give the same files.
"""

import argparse
import datetime
import importlib.util
import json
import logging
import math
import os
import platform
import sys
import time
import traceback
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# --------------------------------------------------------------------------------------------
# Captured warnings / transformers log records (to show the GDN fast path is not used silently)
# --------------------------------------------------------------------------------------------
CAPTURED = []


class _ListHandler(logging.Handler):
    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        key = f"log[{record.name}:{record.levelname}] {msg}"
        if key not in _SEEN:
            _SEEN.add(key)
            CAPTURED.append(key)


_SEEN = set()


def _showwarning(message, category, filename, lineno, file=None, line=None):
    key = f"warning[{category.__name__}] {filename}:{lineno}: {message}"
    if key in _SEEN:
        return
    _SEEN.add(key)
    CAPTURED.append(key)
    print(f"WARNING captured: {key}", flush=True)


warnings.showwarning = _showwarning
warnings.simplefilter("always")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

logging.getLogger("transformers").addHandler(_ListHandler(level=logging.WARNING))

import transformers  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration  # noqa: E402

try:
    from transformers import Qwen3_5Config, Qwen3_5TextConfig
except ImportError:  # pragma: no cover
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig

import safetensors  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

LIN, FULL = "linear_attention", "full_attention"

# --------------------------------------------------------------------------------------------
# The configs
# --------------------------------------------------------------------------------------------
CONFIGS = {
    "tiny-causal": dict(
        cls="causal", seed=101, tied=True,
        text=dict(hidden_size=64, num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL],
                  intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=300,
                  rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.25}),
    ),
    "tiny-cond-untied": dict(
        cls="cond", seed=202, tied=False, shard_bytes=300_000,
        text=dict(hidden_size=96, num_hidden_layers=5, layer_types=[FULL, LIN, FULL, LIN, LIN],
                  intermediate_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32,
                  linear_value_head_dim=24, linear_conv_kernel_dim=4, vocab_size=320,
                  rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.5, "mrope_section": [6, 5, 5],
                                   "mrope_interleaved": True}),
        vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=96,
                    num_position_embeddings=64),
    ),
    "small-mha": dict(
        cls="causal", seed=303, tied=True,
        text=dict(hidden_size=128, num_hidden_layers=6, layer_types=[LIN, FULL, LIN, LIN, FULL, LIN],
                  intermediate_size=256, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                  linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32,
                  linear_value_head_dim=32, linear_conv_kernel_dim=4, vocab_size=512,
                  rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.25}),
    ),
}

REF_08B = dict(hidden_size=1024, num_hidden_layers=24, layer_types=([LIN] * 3 + [FULL]) * 6,
               intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
               linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
               linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320,
               rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True})

ROW_LENGTHS = [1, 2, 5, 63, 64, 65, 130, 200, 700, 1500, 128, 333]  # row 3 is the debug row
DEBUG_ROW = 3
CALIB_FACTORS = [0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.6]
CALIB_TARGET = 0.6


def text_config(spec, tied):
    kw = dict(spec)
    kw["tie_word_embeddings"] = tied
    # partial_rotary_factor is also passed as a kwarg: Qwen3_5TextConfig defaults that kwarg to 0.25
    # and copies it into rope_parameters only where rope_parameters lacks it.
    kw["partial_rotary_factor"] = spec["rope_parameters"]["partial_rotary_factor"]
    return kw


def make_config(c):
    if c["cls"] == "causal":
        return Qwen3_5TextConfig(**text_config(c["text"], c["tied"]))
    return Qwen3_5Config(text_config=text_config(c["text"], c["tied"]), vision_config=dict(c["vision"]),
                         tie_word_embeddings=c["tied"])


def model_class(c):
    return Qwen3_5ForCausalLM if c["cls"] == "causal" else Qwen3_5ForConditionalGeneration


def text_prefix(c):
    return "model." if c["cls"] == "causal" else "model.language_model."


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------
ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                "k_norm.weight")


def redraw(model, c, seed, factor):
    """Re-draws every parameter from a seeded generator. factor scales the output embedding."""
    g = torch.Generator().manual_seed(seed)
    pre = text_prefix(c)
    H = c["text"]["hidden_size"]
    kinds = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)

            def normal(std, mean=0.0):
                return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

            if name.endswith(ZERO_CENTRED) or name == pre + "norm.weight":
                v, kind = normal(0.2), "zero-centred norm N(0,0.2)"
            elif name.endswith("linear_attn.norm.weight"):
                v, kind = normal(0.2, 1.0), "gated norm 1+N(0,0.2)"
            elif name.endswith("A_log"):
                lo, hi = math.log(0.02), math.log(8.0)
                u = torch.rand(shape, generator=g, dtype=torch.float32)
                v, kind = lo + (hi - lo) * u, "A_log: exp(A_log) log-uniform in [0.02,8]"
            elif name.endswith("dt_bias"):
                v, kind = normal(0.5), "dt_bias N(0,0.5)"
            elif name.endswith("conv1d.weight"):
                v, kind = normal(0.5), "conv1d N(0,0.5)"
            elif name == pre + "embed_tokens.weight":
                if c["tied"]:
                    v, kind = normal(factor / math.sqrt(H)), "tied embedding N(0,(f/sqrt(H))^2)"
                else:
                    v, kind = normal(1.0), "input embedding N(0,1)"
            elif name == "lm_head.weight":
                v, kind = normal(factor / math.sqrt(H)), "lm_head N(0,(f/sqrt(H))^2)"
            elif p.dim() >= 2:
                fan_in = int(np.prod(shape[1:]))
                v, kind = normal(1.0 / math.sqrt(fan_in)), "matrix N(0,1/fan_in)"
            else:
                v, kind = normal(0.02), "other 1-D N(0,0.02)"
            p.copy_(v.to(p.dtype))
            kinds[name] = kind
    return kinds


def observe_init(model, c):
    """What transformers' own init gives (before our re-draw)."""
    obs = {}
    pre = text_prefix(c)
    layers = c["text"]["layer_types"]
    li = layers.index(LIN)
    gdn = f"{pre}layers.{li}.linear_attn."
    sd = dict(model.named_parameters())
    w = sd[gdn + "norm.weight"]
    obs["gdn_norm_weight_init"] = "ones" if bool(torch.all(w == 1)) else f"not ones (mean {w.float().mean():.4f})"
    obs["dt_bias_init"] = "ones" if bool(torch.all(sd[gdn + "dt_bias"] == 1)) else "not ones"
    a = sd[gdn + "A_log"].float().exp()
    obs["A_init_range"] = [float(a.min()), float(a.max())]
    obs["conv1d_weight_shape"] = list(sd[gdn + "conv1d.weight"].shape)
    obs["input_layernorm_init"] = ("zeros" if bool(torch.all(sd[f"{pre}layers.0.input_layernorm.weight"] == 0))
                                   else "not zeros")
    fi = layers.index(FULL)
    obs["q_norm_init"] = ("zeros" if bool(torch.all(sd[f"{pre}layers.{fi}.self_attn.q_norm.weight"] == 0))
                          else "not zeros")
    obs["final_norm_init"] = "zeros" if bool(torch.all(sd[pre + "norm.weight"] == 0)) else "not zeros"
    obs["q_proj_shape"] = list(sd[f"{pre}layers.{fi}.self_attn.q_proj.weight"].shape)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    obs["lm_head_is_embed_tokens_param"] = bool(out is emb or out.data_ptr() == emb.data_ptr())
    try:
        obs["rotary_inv_freq_len"] = int(model.model.rotary_emb.inv_freq.numel()) if c["cls"] == "causal" \
            else int(model.model.language_model.rotary_emb.inv_freq.numel())
    except Exception as e:  # noqa: BLE001
        obs["rotary_inv_freq_len"] = f"? {e}"
    return obs


def gdn_path_info(model, c):
    info = {}
    try:
        from transformers.utils import import_utils as iu
        for fn in ("is_flash_linear_attention_available", "is_causal_conv1d_available",
                   "is_kernels_available"):
            f = getattr(iu, fn, None)
            if f is not None:
                try:
                    info[fn] = bool(f())
                except Exception as e:  # noqa: BLE001
                    info[fn] = f"error {e}"
    except Exception as e:  # noqa: BLE001
        info["import_utils"] = f"error {e}"
    for mod in ("fla", "causal_conv1d", "kernels"):
        info[f"module {mod} importable"] = importlib.util.find_spec(mod) is not None
    pre = text_prefix(c)
    li = c["text"]["layer_types"].index(LIN)
    m = model.get_submodule(f"{pre}layers.{li}.linear_attn")
    for attr in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update"):
        f = getattr(m, attr, None)
        if f is not None:
            info[f"linear_attn.{attr}"] = f"{getattr(f, '__module__', '?')}.{getattr(f, '__name__', repr(f))}"
    return info


# --------------------------------------------------------------------------------------------
# Forward helpers
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def hf_logits(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def answer(logits, row):
    probs = []
    for s, n in zip(row["slots"], row["nopts"]):
        z = logits[s, row["letters"][:n]].double()
        probs.append(torch.softmax(z, dim=0).tolist())
    return probs


def prob_stats(all_probs):
    """all_probs: list of per-slot lists. Stats over slots with >= 2 options."""
    mx4, mx_all, flat = [], [], []
    sat = 0
    for p in all_probs:
        if len(p) < 2:
            continue
        m = max(p)
        mx_all.append(m)
        flat.extend(p)
        sat += m > 0.99
        if len(p) == 4:
            mx4.append(m)
    return {
        "slots_ge2": len(mx_all),
        "mean_maxprob_ge2": float(np.mean(mx_all)) if mx_all else None,
        "mean_maxprob_4opts": float(np.mean(mx4)) if mx4 else None,
        "n_4opts": len(mx4),
        "min_prob": float(min(flat)) if flat else None,
        "max_prob": float(max(flat)) if flat else None,
        "min_maxprob": float(min(mx_all)) if mx_all else None,
        "max_maxprob": float(max(mx_all)) if mx_all else None,
        "saturated_gt_0.99": int(sat),
    }


# --------------------------------------------------------------------------------------------
# Independent oracle: docs/design.md section 4 in float64, per-token delta-rule recurrence
# --------------------------------------------------------------------------------------------
def rms0(x, w, eps):  # zero-centred
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def l2n(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


@torch.no_grad()
def oracle(sd, c, ids, want_mixers=False):
    t = c["text"]
    pre = text_prefix(c)
    eps = t["rms_norm_eps"]
    H = t["hidden_size"]
    nh, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv, dk, dv = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                      t["linear_value_head_dim"])
    K = t["linear_conv_kernel_dim"]
    rp = t["rope_parameters"]
    rd = int(hd * rp["partial_rotary_factor"])
    theta = rp["rope_theta"]

    def W(n):
        return sd[pre + n]

    L = len(ids)
    idx = torch.tensor(ids, dtype=torch.long)
    h = W("embed_tokens.weight")[idx].clone()
    hiddens, mixers = [], []
    pos = torch.arange(L, dtype=torch.float64)
    # inv_freq the way transformers computes it (float32), angles in float64
    inv = (1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))).double()
    ang = pos[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]

    def rope(x):  # x [L, heads, hd]
        xr, xp = x[..., :rd], x[..., rd:]
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
        rot = torch.cat([-x2, x1], -1)
        return torch.cat([xr * cos + rot * sin, xp], -1)

    for i, lt in enumerate(t["layer_types"]):
        p = f"layers.{i}."
        x = rms0(h, W(p + "input_layernorm.weight"), eps)
        if lt == FULL:
            a = p + "self_attn."
            qg = (x @ W(a + "q_proj.weight").T).view(L, nh, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:].reshape(L, nh * hd)
            k = (x @ W(a + "k_proj.weight").T).view(L, nkv, hd)
            v = (x @ W(a + "v_proj.weight").T).view(L, nkv, hd)
            q = rope(rms0(q, W(a + "q_norm.weight"), eps))
            k = rope(rms0(k, W(a + "k_norm.weight"), eps))
            grp = nh // nkv
            kk = k.repeat_interleave(grp, dim=1)
            vv = v.repeat_interleave(grp, dim=1)
            sc = torch.einsum("qhd,khd->hqk", q, kk) * hd ** -0.5
            mask = torch.ones(L, L, dtype=torch.bool).triu(1)
            sc = sc.masked_fill(mask, float("-inf"))
            pr = torch.softmax(sc, -1)
            o = torch.einsum("hqk,khd->qhd", pr, vv).reshape(L, nh * hd)
            o = (o * torch.sigmoid(gate)) @ W(a + "o_proj.weight").T
        else:
            a = p + "linear_attn."
            qkv = x @ W(a + "in_proj_qkv.weight").T  # [L, C]
            cw = W(a + "conv1d.weight")  # [C, 1, K]
            xp = torch.cat([torch.zeros(K - 1, qkv.shape[1], dtype=qkv.dtype), qkv], 0)
            conv = torch.zeros_like(qkv)
            for j in range(K):
                conv += xp[j:j + L] * cw[:, 0, j][None, :]
            conv = F.silu(conv)
            q = conv[:, : nk * dk].reshape(L, nk, dk)
            k = conv[:, nk * dk: 2 * nk * dk].reshape(L, nk, dk)
            v = conv[:, 2 * nk * dk:].reshape(L, nv, dv)
            q = l2n(q) * dk ** -0.5
            k = l2n(k)
            rep = nv // nk
            q = q.repeat_interleave(rep, dim=1)
            k = k.repeat_interleave(rep, dim=1)
            z = (x @ W(a + "in_proj_z.weight").T).reshape(L, nv, dv)
            beta = torch.sigmoid(x @ W(a + "in_proj_b.weight").T)
            aa = x @ W(a + "in_proj_a.weight").T
            g = -torch.exp(W(a + "A_log")) * F.softplus(aa + W(a + "dt_bias"))
            S = torch.zeros(nv, dk, dv, dtype=torch.float64)
            out = torch.zeros(L, nv, dv, dtype=torch.float64)
            eg = torch.exp(g)
            for tt in range(L):
                S = S * eg[tt][:, None, None]
                kt = k[tt]
                kv = torch.einsum("hkv,hk->hv", S, kt)
                delta = (v[tt] - kv) * beta[tt][:, None]
                S = S + kt[:, :, None] * delta[:, None, :]
                out[tt] = torch.einsum("hkv,hk->hv", S, q[tt])
            o = out / torch.sqrt((out * out).mean(-1, keepdim=True) + eps) * W(a + "norm.weight") * F.silu(z)
            o = o.reshape(L, nv * dv) @ W(a + "out_proj.weight").T
        if want_mixers:
            mixers.append(o[-1].clone())
        h = h + o
        x = rms0(h, W(p + "post_attention_layernorm.weight"), eps)
        mlp = p + "mlp."
        h = h + (F.silu(x @ W(mlp + "gate_proj.weight").T) * (x @ W(mlp + "up_proj.weight").T)) @ \
            W(mlp + "down_proj.weight").T
        hiddens.append(h)
    hn = rms0(h, W("norm.weight"), eps)
    return hn, hiddens, mixers


def oracle_answer(sd, c, row, out_w):
    hn, _, _ = oracle(sd, c, row["ids"])
    probs = []
    for s, n in zip(row["slots"], row["nopts"]):
        z = out_w[row["letters"][:n]] @ hn[s]
        probs.append(torch.softmax(z, 0).tolist())
    return probs


def max_diff(pa, pb):
    m = 0.0
    for ra, rb in zip(pa, pb):
        for sa, sb in zip(ra, rb):
            for x, y in zip(sa, sb):
                m = max(m, abs(x - y))
    return m


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------
def make_rows(V, rng):
    rows = []
    for i, L in enumerate(ROW_LENGTHS):
        ids = rng.integers(0, V, size=L).tolist()
        nl = int(rng.integers(4, 7))
        letters = [int(x) for x in rng.choice(V, size=nl, replace=False)]
        ns = min(L, int(rng.integers(1, 6)))
        chosen = set()
        if i % 3 != 2 or L == 1:
            chosen.add(L - 1)
        if i == 4:
            chosen.add(0)
        pool = [p for p in range(L) if p not in chosen]
        while len(chosen) < ns and pool:
            j = int(rng.integers(0, len(pool)))
            chosen.add(pool.pop(j))
        slots = sorted(chosen)
        nopts = [int(rng.integers(1, nl + 1)) for _ in slots]
        if i == 1:
            nopts[0] = 1
        if i == 7:
            nopts[-1] = 1
        if i == 5:
            nopts = [nl for _ in slots]
        if i in (6, 9):
            nopts = [min(4, nl) for _ in slots]
        row = {"ids": [int(x) for x in ids], "slots": slots, "nopts": nopts, "letters": letters}
        if i not in (1, 10):  # state_len is optional: two rows leave it out
            row["state_len"] = int(slots[0])
        rows.append(row)
    return rows


def make_cache_rows(V, rng):
    """An agent-like sequence for the cache tests. Returns (rows, labels)."""
    letters = [int(x) for x in rng.choice(V, size=5, replace=False)]

    def toks(n):
        return [int(x) for x in rng.integers(0, V, size=n)]

    def q(state, suffix, nslots=None, label=""):
        ids = state + suffix
        ns = nslots if nslots is not None else int(rng.integers(1, 4))
        ns = min(ns, len(suffix))
        chosen = {len(ids) - 1}
        pool = [len(state) + j for j in range(len(suffix) - 1)]
        while len(chosen) < ns and pool:
            j = int(rng.integers(0, len(pool)))
            chosen.add(pool.pop(j))
        slots = sorted(chosen)
        nopts = [int(rng.integers(2, len(letters) + 1)) for _ in slots]
        return {"ids": ids, "slots": slots, "nopts": nopts, "letters": letters, "state_len": len(state)}, label

    S1 = toks(600)
    qa, qb, qc = toks(12), toks(27), toks(40)
    act1 = toks(20)
    S1m = list(S1)
    S1m[290:320] = toks(30)
    S2 = toks(1300)
    S2b = S2[:400] + toks(500)
    S2m = list(S2)
    S2m[700:730] = toks(30)
    S3 = toks(350)
    S4 = toks(480)
    S64 = toks(64 * 9)
    act2 = toks(25)
    act3 = toks(18)
    Sshort = toks(200)
    out = []
    out.append(q(S1, qa, label="S1 (600) + question a"))
    out.append(q(S1, qb, label="S1 + question b"))
    out.append(q(S3, toks(15), label="S3 (350) unrelated state"))
    out.append(q(S1, qc, label="S1 + question c"))
    out.append(q(S1 + act1, toks(22), label="S1 + action (20) appended: state 620"))
    out.append(q(S4, toks(30), label="S4 (480) unrelated state"))
    out.append(q(S1m, qa, label="S1 with tokens 290..319 changed + question a"))
    out.append((dict(out[1][0]), "exact repeat of row 1"))
    out.append(q(S2, toks(20), label="S2 (1300, longer than a 512 stride) + question"))
    out.append(q(S3, toks(25), label="S3 + another question"))
    out.append(q(S2, toks(33), label="S2 + another question"))
    out.append(q(S2b, toks(16), label="first 400 tokens of S2 then 500 new tokens (state 900)"))
    out.append(q(S64, toks(14), label="state of exactly 576 = 64*9 tokens"))
    out.append(q(S4, toks(11), label="S4 + another question"))
    out.append(q(S2 + act2, toks(24), label="S2 + action (25): state 1325"))
    out.append(q(S1 + act1 + act3, toks(19), label="S1 + action + action (18): state 638"))
    out.append(q(S64, toks(26), label="576-token state + another question"))
    out.append(q(S2m, toks(21), label="S2 with tokens 700..729 changed + question"))
    out.append(q(S3 + act3, toks(17), label="S3 + action (18): state 368"))
    out.append((dict(out[11][0]), "exact repeat of row 11"))
    out.append(q(Sshort, toks(20), label="short state (200 < min_prefix 256): plain path"))
    r, _ = q(S4, toks(30), nslots=1)
    # 5 slots in the suffix: more than max_slots (4): plain path
    suffix_start = len(S4)
    r["slots"] = sorted({suffix_start + 3, suffix_start + 9, suffix_start + 15, suffix_start + 22,
                         suffix_start + 29})
    r["nopts"] = [2, 3, 4, 5, 4]
    out.append((r, "S4 + question with 5 slots (> max_slots 4): plain path"))
    r, _ = q(S3, toks(20), nslots=1)
    r["slots"] = [100, len(r["ids"]) - 1]
    r["nopts"] = [3, 4]
    out.append((r, "S3 + question with a slot inside the state (pos 100): plain path"))
    out.append(q(S2 + act2, toks(12), label="S2 + action again, new question"))
    out.append(q(S1, qa, label="S1 + question a again (after the others)"))
    out.append(q(S1, qb, label="S1 + question b again"))
    out.append(q(S1, qc, label="S1 + question c again"))
    out.append(q(S1 + act1, toks(13), label="S1 + action again, new question"))
    out.append(q(S4, toks(18), label="S4 again"))
    out.append(q(S64 + toks(64), toks(10), label="576-token state + 64 more tokens (state 640)"))
    rows = [r for r, _ in out]
    labels = [lab for _, lab in out]
    return rows, labels


# --------------------------------------------------------------------------------------------
# Building one config
# --------------------------------------------------------------------------------------------
def build_model(c, factor, seed):
    torch.manual_seed(seed)
    cfg = make_config(c)
    model = model_class(c)(cfg)
    model.eval()
    return model


def calibrate(c, rng_seed):
    V = c["text"]["vocab_size"]
    rng = np.random.default_rng(rng_seed + 7)
    calib = []
    for L in (96, 300):
        ids = rng.integers(0, V, size=L).tolist()
        letters = rng.choice(V, size=4, replace=False).tolist()
        calib.append((ids, letters))
    res = {}
    for f in CALIB_FACTORS:
        model = build_model(c, f, c["seed"])
        redraw(model, c, c["seed"], f)
        mx = []
        for ids, letters in calib:
            lg = hf_logits(model, ids)[:, letters].double()
            mx.extend(torch.softmax(lg, -1).max(-1).values.tolist())
        res[f] = float(np.mean(mx))
        del model
    best = min(res, key=lambda f: abs(res[f] - CALIB_TARGET))
    return best, res


def reload_and_check(c, d, bf16_sd):
    cls = model_class(c)
    try:
        model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, (n, p.dtype)
    file_sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            file_sd.update(load_file(os.path.join(d, fn)))
    msd = model.state_dict()
    problems = []
    fixed = 0
    for k, v in file_sd.items():
        if k not in msd:
            problems.append(f"file tensor {k} not in model state_dict")
            continue
        if v.dtype != torch.bfloat16:
            problems.append(f"{k} saved as {v.dtype}")
        if not torch.equal(msd[k].float(), v.float()):
            problems.append(f"{k}: reloaded value differs from file; overwritten from file")
            with torch.no_grad():
                msd[k].copy_(v.float())
            fixed += 1
        if k in bf16_sd and not torch.equal(bf16_sd[k].float(), v.float()):
            problems.append(f"{k}: file differs from the bf16 model")
    for k in msd:
        if k not in file_sd and not (k == "lm_head.weight" and c["tied"]):
            problems.append(f"model tensor {k} not in files")
    if fixed:  # a second pass: overwriting a tied tensor could have broken another one
        msd = model.state_dict()
        still = [k for k, v in file_sd.items() if k in msd and not torch.equal(msd[k].float(), v.float())]
        if still:
            problems.append(f"UNFIXABLE: still differ from the files: {still}")
    return model, sorted(file_sd.keys()), {k: list(v.shape) for k, v in file_sd.items()}, problems


def write_jsonl(path, objs):
    with open(path, "w") as f:
        for o in objs:
            f.write(json.dumps(o, separators=(",", ":")) + "\n")


def do_config(name, c, out_dir, args, manifest):
    log(f"=== {name} ===")
    d = os.path.join(out_dir, "models", name)
    os.makedirs(d, exist_ok=True)
    info = {"class": model_class(c).__name__}

    # transformers' own init, observed
    m0 = build_model(c, 1.0, c["seed"])
    info["init_observations"] = observe_init(m0, c)
    info["gdn_path"] = gdn_path_info(m0, c)
    info["state_dict_has_lm_head"] = "lm_head.weight" in m0.state_dict()
    log("init observations:", json.dumps(info["init_observations"]))
    log("gdn path:", json.dumps(info["gdn_path"]))
    del m0

    best, res = calibrate(c, c["seed"])
    info["calibration"] = {"target_mean_maxprob_4opts": CALIB_TARGET, "by_factor": res, "chosen": best}
    log(f"calibration (factor -> mean max-prob on fp32 calibration rows): {res}; chosen {best}")

    model = build_model(c, best, c["seed"])
    info["init_kinds"] = redraw(model, c, c["seed"], best)
    model = model.to(torch.bfloat16)
    bf16_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    kw = {}
    if c.get("shard_bytes"):
        kw["max_shard_size"] = c["shard_bytes"]
    model.save_pretrained(d, **kw)  # safetensors is save_pretrained's default (and only format in v5)
    del model
    files = sorted(os.listdir(d))
    assert any(f.endswith(".safetensors") for f in files), f"no safetensors written: {files}"
    info["saved_files"] = files
    log("saved:", files)
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        shards = sorted(set(idx["weight_map"].values()))
        info["shards"] = shards
        log(f"index.json: {len(idx['weight_map'])} tensors in {len(shards)} shards")

    model, keys, shapes, problems = reload_and_check(c, d, bf16_sd)
    info["saved_tensors"] = shapes
    info["reload_problems"] = problems
    log(f"reloaded float32: {len(keys)} tensors in files; problems: {problems if problems else 'none'}")
    emb = model.get_input_embeddings().weight
    outw = model.get_output_embeddings().weight
    info["reloaded_lm_head_tied"] = bool(outw.data_ptr() == emb.data_ptr())
    info["reloaded_lm_head_equals_embed"] = bool(outw.shape == emb.shape and torch.equal(outw, emb))
    with open(os.path.join(d, "config.json")) as f:
        info["config_json"] = json.load(f)

    V = c["text"]["vocab_size"]
    rng = np.random.default_rng(c["seed"])
    rows = make_rows(V, rng)
    sd64 = {k: v.detach().double() for k, v in model.state_dict().items()}
    pre = text_prefix(c)
    out_w = outw.detach().double()  # lm_head when untied, embed_tokens when tied
    if c["tied"]:
        assert torch.equal(out_w, sd64[pre + "embed_tokens.weight"])
    else:
        assert "lm_head.weight" in keys, "untied model saved without lm_head.weight"
    info["files_hold_lm_head"] = "lm_head.weight" in keys

    def run_rows(rows, label):
        exp = []
        odiff = 0.0
        tf = 0.0
        for i, r in enumerate(rows):
            t1 = time.time()
            lg = hf_logits(model, r["ids"])
            p = answer(lg, r)
            tf += time.time() - t1
            exp.append({"probs": p})
            if not args.no_oracle:
                po = oracle_answer(sd64, c, r, out_w)
                odiff = max(odiff, max_diff([p], [po]))
        log(f"{label}: {len(rows)} rows, hf forward {tf:.1f}s, max |hf - oracle| = {odiff:.3g}")
        return exp, odiff

    exp, odiff = run_rows(rows, "rows")
    write_jsonl(os.path.join(d, "rows.jsonl"), rows)
    write_jsonl(os.path.join(d, "expected.jsonl"), exp)
    st = prob_stats([p for e in exp for p in e["probs"]])
    info["rows"] = {"count": len(rows), "lengths": [len(r["ids"]) for r in rows],
                    "slots": sum(len(r["slots"]) for r in rows), "stats": st,
                    "oracle_max_abs_diff": None if args.no_oracle else odiff}
    log(f"PROB STATS {name}: {json.dumps(st)}")

    if name == "tiny-causal":
        crows, labels = make_cache_rows(V, np.random.default_rng(c["seed"] + 1000))
        cexp, codiff = run_rows(crows, "cache rows")
        write_jsonl(os.path.join(d, "cache_rows.jsonl"), crows)
        write_jsonl(os.path.join(d, "cache_expected.jsonl"), cexp)
        with open(os.path.join(d, "cache_labels.txt"), "w") as f:
            for i, lab in enumerate(labels):
                f.write(f"{i}\t{len(crows[i]['ids'])}\t{crows[i]['state_len']}\t{lab}\n")
        cst = prob_stats([p for e in cexp for p in e["probs"]])
        info["cache_rows"] = {"count": len(crows), "stats": cst,
                              "oracle_max_abs_diff": None if args.no_oracle else codiff}
        log(f"PROB STATS {name} cache rows: {json.dumps(cst)}")
        try:
            info["debug"] = write_debug(model, c, rows[DEBUG_ROW], sd64, d)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            info["debug"] = "FAILED: " + traceback.format_exc()
    manifest["configs"][name] = info
    del model


@torch.no_grad()
def write_debug(model, c, row, sd64, d):
    pre = text_prefix(c)
    base = model.get_submodule(pre[:-1])
    L = len(row["ids"])
    caught = {"layers": {}, "mixers": {}}
    hooks = []

    def first(o):
        return o[0] if isinstance(o, (tuple, list)) else o

    hooks.append(base.embed_tokens.register_forward_hook(
        lambda m, i, o: caught.__setitem__("emb", first(o)[0, -1].float().clone())))
    for li, layer in enumerate(base.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, li=li: caught["layers"].__setitem__(li, first(o)[0, -1].float().clone())))
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        hooks.append(mixer.register_forward_hook(
            lambda m, i, o, li=li: caught["mixers"].__setitem__(li, first(o)[0, -1].float().clone())))
    hooks.append(base.norm.register_forward_hook(
        lambda m, i, o: caught.__setitem__("norm", first(o)[0, -1].float().clone())))
    out = model(input_ids=torch.tensor([row["ids"]]), use_cache=False, output_hidden_states=True)
    for h in hooks:
        h.remove()
    nl = len(base.layers)
    after = [caught["layers"][i].tolist() for i in range(nl)]
    hs = out.hidden_states
    hs_info = {"len": len(hs) if hs is not None else None}
    if hs is not None:
        last = hs[-1][0, -1].float()
        hs_info["index0_equals_embedding"] = bool(torch.allclose(hs[0][0, -1].float(), caught["emb"]))
        hs_info["last_equals_final_norm"] = bool(torch.allclose(last, caught["norm"]))
        hs_info["last_equals_after_last_layer"] = bool(torch.allclose(last, caught["layers"][nl - 1]))
        hs_info["middle_equal_after_layer"] = [bool(torch.allclose(hs[i + 1][0, -1].float(), caught["layers"][i]))
                                               for i in range(min(nl, len(hs) - 1))]
    hn, hid, mix = oracle(sd64, c, row["ids"], want_mixers=True)
    odiff = [float((hid[i][-1] - caught["layers"][i].double()).abs().max()) for i in range(nl)]
    mdiff = [float((mix[i] - caught["mixers"][i].double()).abs().max()) for i in range(nl)]
    ndiff = float((hn[-1] - caught["norm"].double()).abs().max())
    lg = out.logits[0, -1, row["letters"]].float().tolist()
    dbg = {
        "description": (
            "Hidden states of tiny-causal for rows.jsonl row 3 at its last position (position = "
            "len(ids)-1), from transformers' float32 forward of the saved bf16 weights. "
            "'embedding' = embed_tokens(ids) (= output_hidden_states[0]); 'after_layer'[i] = the "
            "residual stream after decoder layer i (mixer and MLP added), i = 0..num_layers-1; "
            "'mixer_output'[i] = the output of layer i's linear_attn / self_attn (after out_proj / "
            "o_proj, before the residual add); 'final_norm' = model.norm(after_layer[-1]) (the vector "
            "that is dotted with the letter embeddings). 'hf_output_hidden_states' says how "
            "transformers' own output_hidden_states tuple relates to these."),
        "row_index": DEBUG_ROW,
        "position": L - 1,
        "ids": row["ids"],
        "layer_types": c["text"]["layer_types"],
        "letters": row["letters"],
        "letter_logits_fp32": lg,
        "embedding": caught["emb"].tolist(),
        "after_layer": after,
        "mixer_output": [caught["mixers"][i].tolist() for i in range(nl)],
        "final_norm": caught["norm"].tolist(),
        "hf_output_hidden_states": hs_info,
        "oracle_float64_max_abs_diff": {"after_layer": odiff, "mixer_output": mdiff, "final_norm": ndiff},
    }
    with open(os.path.join(d, "debug.json"), "w") as f:
        json.dump(dbg, f)
    log("debug.json: hidden_states", json.dumps(hs_info), "oracle diffs", json.dumps(dbg["oracle_float64_max_abs_diff"]))
    return {"hf_output_hidden_states": hs_info, "oracle_diffs": dbg["oracle_float64_max_abs_diff"]}


def tensors_08b(out_dir, manifest):
    log("=== qwen3.5-0.8b tensor list (meta device) ===")
    res = {}
    notes = {}

    def names(model, skip_visual):
        sd = model.state_dict()
        emb = model.get_input_embeddings().weight
        outw = model.get_output_embeddings().weight
        # on meta every data_ptr is 0: tying is seen as the same Parameter object
        same = outw is emb
        d = {}
        for k, v in sd.items():
            if skip_visual and k.startswith("model.visual"):
                continue
            if k == "lm_head.weight":  # the config is tied: save_pretrained drops the duplicate
                continue
            d[k] = list(v.shape)
        return d, same, "lm_head.weight" in sd

    def build(cls, cfg):
        try:
            with torch.device("meta"):
                return cls(cfg)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            from accelerate import init_empty_weights
            with init_empty_weights():
                return cls(cfg)

    tcfg = Qwen3_5TextConfig(**text_config(REF_08B, True))
    m = build(Qwen3_5ForCausalLM, tcfg)
    res["causal"], tied, has = names(m, False)
    notes["causal"] = {"lm_head_tied_to_embed_tokens": tied, "state_dict_contains_lm_head": has,
                       "count": len(res["causal"])}
    del m
    ccfg = Qwen3_5Config(text_config=text_config(REF_08B, True),
                         vision_config=dict(CONFIGS["tiny-cond-untied"]["vision"], out_hidden_size=1024),
                         tie_word_embeddings=True)
    m = build(Qwen3_5ForConditionalGeneration, ccfg)
    res["conditional_text"], tied, has = names(m, True)
    notes["conditional_text"] = {"lm_head_tied_to_embed_tokens": tied, "state_dict_contains_lm_head": has,
                                 "count": len(res["conditional_text"])}
    del m
    npar = sum(int(np.prod(s)) for s in res["causal"].values())
    notes["causal_parameter_count"] = npar
    notes["about"] = ("Tensor names and shapes of transformers' Qwen3.5 0.8B text model, built on the meta "
                      "device from the reference config, as save_pretrained writes them: when the embeddings "
                      "are tied, lm_head.weight (present in state_dict as a tied duplicate) is left out. "
                      "conditional_text leaves out model.visual.*; real checkpoints may also hold mtp.* "
                      "tensors, which transformers' model does not have.")
    notes["config"] = REF_08B
    out = {"causal": res["causal"], "conditional_text": res["conditional_text"], "notes": notes}
    with open(os.path.join(out_dir, "qwen3.5-0.8b-tensors.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    log(f"0.8b: causal {len(res['causal'])} tensors ({npar} params), conditional_text "
        f"{len(res['conditional_text'])} tensors; notes {json.dumps({k: notes[k] for k in ('causal', 'conditional_text')})}")
    manifest["qwen3.5-0.8b"] = notes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--only", nargs="*", help="config names to build (default: all)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the float64 cross-check")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    manifest = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "safetensors": safetensors.__version__,
        "numpy": np.__version__, "device": "cpu", "threads": torch.get_num_threads(),
        "platform": platform.platform(), "configs": {}, "failures": [],
    }
    log("versions:", json.dumps({k: manifest[k] for k in ("python", "torch", "transformers", "safetensors",
                                                           "numpy", "threads")}))
    for name, c in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        try:
            do_config(name, c, args.out, args, manifest)
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()
            print(tb, flush=True)
            manifest["failures"].append({"config": name, "traceback": tb})
    try:
        tensors_08b(args.out, manifest)
    except Exception:  # noqa: BLE001
        tb = traceback.format_exc()
        print(tb, flush=True)
        manifest["failures"].append({"config": "qwen3.5-0.8b-tensors", "traceback": tb})
    manifest["captured_warnings"] = CAPTURED
    manifest["seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    log(f"captured warnings/log records: {len(CAPTURED)}")
    for w in CAPTURED[:40]:
        print("  ", w[:400])
    log("failures:", len(manifest["failures"]))
    for name, info in manifest["configs"].items():
        r = info.get("rows", {})
        print(f"SUMMARY {name}: factor {info['calibration']['chosen']} stats {json.dumps(r.get('stats'))} "
              f"oracle {r.get('oracle_max_abs_diff')} reload_problems {len(info.get('reload_problems', []))}")
    return 1 if manifest["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
