#!/usr/bin/env python3
"""cpu_cuda_bisect.py OUTDIR — random Qwen3.5 checkpoints (made with transformers on the GPU machine) that
differ from a small base in one dimension each, plus rows, for locating a CPU/CUDA mismatch by shape.
Run by tools/cpu_cuda_bisect.sh, which compares `squad score --device cpu` with `--device cuda` on each."""
import json, os, sys, random, torch
from transformers import Qwen3_5ForCausalLM
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
out = sys.argv[1]
base = dict(hidden_size=256, num_hidden_layers=4, layer_types=["linear_attention"]*3+["full_attention"], intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=4,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, vocab_size=512, tie_word_embeddings=True,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            initializer_range=0.06)
variants = {"A": {}, "B_hd256": {"head_dim": 256}, "C_dk128": {"linear_key_head_dim": 128, "linear_value_head_dim": 128},
            "D_H1024": {"hidden_size": 1024, "intermediate_size": 1024}, "E_heads": {"num_attention_heads": 8, "linear_num_key_heads": 16, "linear_num_value_heads": 16},
            "F_08blike": {"hidden_size": 1024, "intermediate_size": 1024, "num_attention_heads": 8, "head_dim": 256, "linear_num_key_heads": 16,
                          "linear_num_value_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128},
            "G_vocab": {"vocab_size": 248320}}
torch.manual_seed(0)
for name, v in variants.items():
    cfg = Qwen3_5TextConfig(**{**base, **v})
    m = Qwen3_5ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and "linear_attn.norm" not in n: p.normal_(0, 0.2)
            elif "linear_attn.norm" in n: p.normal_(1, 0.2)
            elif "A_log" in n: p.uniform_(-1, 2)
            elif "dt_bias" in n: p.normal_(0, 0.5)
            elif "conv1d" in n: p.normal_(0, 0.5)
            else: p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
    d = os.path.join(out, name)
    m.to(torch.bfloat16).save_pretrained(d)
    random.seed(1)
    V = cfg.vocab_size
    with open(os.path.join(d, "rows.jsonl"), "w") as f:
        for n in (100, 300):
            f.write(json.dumps({"ids": [random.randrange(V) for _ in range(n)], "slots": [n // 2, n - 1], "nopts": [4, 4], "letters": [1, 2, 3, 4]}) + "\n")
    print("made", name, flush=True)
