#!/usr/bin/env python3
"""hf_timing.py — transformers' own bf16 forward on the rows bench_gpu ran, on the same weights.

    python3 tools/hf_timing.py --model DIR --rows ROWS.jsonl [--reps N] [--out FILE.json]

ROWS.jsonl is bench_gpu's --rows-out: one row per case (cold rows; hits with "state_len") with
squad's letter probabilities. For each row this script
  - runs transformers (AutoModelForCausalLM, bf16, CUDA, its default attention and whatever Gated
    DeltaNet kernels it finds: flash-linear-attention when importable, else its PyTorch fallback),
  - compares the letter probabilities at the slot with squad's (max absolute difference, argmax),
  - times the forward with CUDA events, median of --reps after a warm-up: a cold row is one forward
    of all its tokens (logits_to_keep=1); a hit is the question's forward on a copy of the state's
    cache (the state's own forward runs once, untimed), the same work squad's hit does.
With --graph a cold row's forward is captured once as a CUDA graph and its replays are timed: run
with flash-linear-attention on the Python path (tools/gpu_run.sh's hf_fla step: a copy of its `fla`
package in the git-ignored .fla/, never committed) this is the earlier runtime's setup.
It also measures the two ceilings once (device-to-device copy bandwidth counting read + write,
and an 8192^3 bf16 matmul on random data) and prints a table; --out writes everything as JSON.
"""
import argparse
import copy
import json
import statistics
import sys
import time


def ceilings(torch):
    dev = "cuda"
    x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # 1 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    torch.cuda.synchronize()
    bw = 2 * (1 << 30) * 10 / (s.elapsed_time(e) * 1e-3) / 1e9
    del x, y
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        a @ b
    e.record()
    torch.cuda.synchronize()
    tf = 2 * n**3 * 10 / (s.elapsed_time(e) * 1e-3) / 1e12
    return bw, tf


def timed(torch, prep, fn, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        x = prep()  # untimed preparation (a cache copy)
        torch.cuda.synchronize()
        s.record()
        fn(x)
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out), min(out)


def capture(torch, model, ids):
    """The cold forward of ids as one CUDA graph (warm-up on a side stream first, so Triton's
    autotuning and lazy initialisation happen outside the capture). Returns (graph, logits) or
    (None, the error)."""
    try:
        static = ids.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(input_ids=static, use_cache=False, logits_to_keep=1)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(input_ids=static, use_cache=False, logits_to_keep=1).logits
        return graph, out
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return None, repr(e)[:200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--bench-json", help="bench_gpu --json output: squad's p50 per case for the ratios")
    ap.add_argument("--graph", action="store_true",
                    help="cold rows: capture the whole forward as one CUDA graph and time its replays (the earlier "
                         "runtime's setup: transformers + flash-linear-attention + CUDA graphs)")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 reference pass")
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    rows = [json.loads(l) for l in open(args.rows) if l.strip()]
    p50 = {}
    if args.bench_json:
        p50 = {j["case"]: j["p50_ms"] for j in (json.loads(l) for l in open(args.bench_json) if l.strip())}
    bw, tf = ceilings(torch)
    print(f"ceilings: copy {bw:.0f} GB/s (read + write), bf16 matmul {tf:.0f} TFLOP/s", flush=True)
    try:
        import fla  # noqa: F401
        gdn = "flash-linear-attention"
    except Exception:  # noqa: BLE001
        gdn = "PyTorch fallback (flash-linear-attention not installed)"
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; model loaded in {time.time() - t0:.1f} s;"
          f" GDN kernels: {gdn}; attention: {model.config._attn_implementation}", flush=True)
    results = []
    state_cache = {}
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["ids"]], device="cuda")
            slot, nopts, letters = r["slots"][0], r["nopts"][0], r["letters"]
            n = ids.shape[1]
            t_start = time.time()
            if r["kind"] == "cold" and args.graph:
                graph, static_out = capture(torch, model, ids)
                if graph is None:
                    print(f"{r['case']:>14}: CUDA graph capture failed ({static_out}); timing eagerly", flush=True)
                    def run(_, ids=ids):
                        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
                else:
                    def run(_, graph=graph, static_out=static_out):
                        graph.replay()
                        return static_out
                logits = run(None)
                hp50, mn = timed(torch, lambda: None, run, args.reps)
                del graph
            elif r["kind"] == "cold":
                def run(_, ids=ids):
                    return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
                logits = run(None)
                hp50, mn = timed(torch, lambda: None, run, args.reps)
            else:
                p = r["state_len"]
                key = tuple(r["ids"][:p])
                if key not in state_cache:
                    state_cache.clear()
                    out = model(input_ids=ids[:, :p], use_cache=True, logits_to_keep=1)
                    state_cache[key] = out.past_key_values
                pkv = state_cache[key]
                q = ids[:, p:]

                def run(cache, q=q):
                    return model(input_ids=q, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                logits = run(copy.deepcopy(pkv))
                hp50, mn = timed(torch, lambda pkv=pkv: copy.deepcopy(pkv), run, args.reps)
            assert slot == n - 1, "bench rows have their slot at the end"
            lg = logits[0, -1, letters[:nopts]].float()
            probs = torch.softmax(lg.double(), -1).tolist()
            diff = max(abs(a - b) for a, b in zip(probs, r["probs"][0]))
            pe = r.get("probs_exact", [[]])[0]
            diff_exact = max((abs(a - b) for a, b in zip(probs, pe)), default=float("nan"))
            same = max(range(nopts), key=lambda i: probs[i]) == max(range(nopts), key=lambda i: r["probs"][0][i])
            res = {"case": r["case"], "hf_p50_ms": hp50, "hf_min_ms": mn, "squad_ms": p50.get(r["case"], r.get("squad_ms")),
                   "max_abs_prob_diff": diff, "max_abs_prob_diff_exact": diff_exact, "same_argmax": same, "hf_probs": probs, "squad_probs": r["probs"][0],
                   "wall_s": time.time() - t_start}
            results.append(res)
            print(f"{r['case']:>14}: transformers p50 {hp50:9.2f} ms (min {mn:.2f}); |p_hf - p_squad| max {diff:.2e} "
                  f"(squad exact: {diff_exact:.2e}), "
                  f"argmax {'same' if same else 'DIFFERS'}", flush=True)
    # the same rows once more through transformers in float32 (probabilities only): the reference
    # that tells transformers' own bf16 noise apart from a difference in the model's arithmetic
    del model
    torch.cuda.empty_cache()
    try:
        if args.no_fp32:
            raise RuntimeError("skipped (--no-fp32)")
        m32 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            for r, x in zip(rows, results):
                ids = torch.tensor([r["ids"]], device="cuda")
                lg = m32(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1, r["letters"][:r["nopts"][0]]]
                p32 = torch.softmax(lg.double(), -1).tolist()
                x["hf_fp32_probs"] = p32
                for key, other in (("fp32_vs_squad_bf16", r["probs"][0]), ("fp32_vs_squad_exact", r.get("probs_exact", [[]])[0]),
                                   ("fp32_vs_hf_bf16", x["hf_probs"])):
                    x[key] = max((abs(a - b) for a, b in zip(p32, other)), default=float("nan"))
                # the argmax rule (docs/design.md section 10): the same argmax wherever the reference's top two differ by > 0.05
                top = sorted(p32, reverse=True)
                x["fp32_margin"] = top[0] - top[1] if len(top) > 1 else 1.0
                best = max(range(len(p32)), key=lambda i: p32[i])
                for key, other in (("argmax_squad_bf16", r["probs"][0]), ("argmax_squad_exact", r.get("probs_exact", [[]])[0]),
                                   ("argmax_hf_bf16", x["hf_probs"])):
                    x[key] = bool(other) and max(range(len(other)), key=lambda i: other[i]) == best
        del m32
    except Exception as e:  # noqa: BLE001
        print(f"float32 reference failed: {e}", flush=True)
    print("\n| case | max abs prob diff vs transformers fp32: squad exact | squad bf16 | transformers bf16 "
          "| fp32 top-two margin | argmax = fp32's: squad exact, squad bf16, transformers bf16 |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    yn = {True: "yes", False: "no", None: "-"}
    for x in results:
        print(f"| {x['case']} | {x.get('fp32_vs_squad_exact', float('nan')):.2e} | {x.get('fp32_vs_squad_bf16', float('nan')):.2e} | "
              f"{x.get('fp32_vs_hf_bf16', float('nan')):.2e} | {x.get('fp32_margin', float('nan')):.3f} | "
              f"{yn[x.get('argmax_squad_exact')]}, {yn[x.get('argmax_squad_bf16')]}, {yn[x.get('argmax_hf_bf16')]} |")
    print("\n| case | transformers p50 ms | squad bf16 p50 ms | ratio | max abs prob diff (squad bf16, exact) | same argmax |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for x in results:
        sq = x["squad_ms"] or float("nan")
        print(f"| {x['case']} | {x['hf_p50_ms']:.2f} | {sq:.3f} | {x['hf_p50_ms'] / sq:.1f}x | "
              f"{x['max_abs_prob_diff']:.2e}, {x['max_abs_prob_diff_exact']:.2e} | {x['same_argmax']} |")
    if args.out:
        json.dump({"ceilings": {"copy_gbs": bw, "bf16_tflops": tf}, "gdn": gdn,
                   "transformers": transformers.__version__, "torch": torch.__version__, "rows": results},
                  open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
