#!/usr/bin/env bash
# cpu_cuda_bisect.sh OUTDIR — on the GPU machine (carry .carry from tools/gpu_run.sh --prepare): builds the
# variant checkpoints of cpu_cuda_bisect.py and prints max |cpu - cuda| (precision exact) for each.
set -u
OUT=$1
python3 tools/cpu_cuda_bisect.py /tmp/bis > $OUT/make.log 2>&1
for d in /tmp/bis/*/; do
  n=$(basename $d)
  ${SQUAD:-.carry/bin/squad} score --model $d --rows $d/rows.jsonl --device cpu --cache-mb 0 > /tmp/cpu.jsonl 2>>$OUT/make.log
  ${SQUAD:-.carry/bin/squad} score --model $d --rows $d/rows.jsonl --device cuda --precision exact --cache-mb 0 > /tmp/cuda.jsonl 2>>$OUT/make.log
  python3 - "$n" <<'PY'
import json, sys
a=[json.loads(l) for l in open('/tmp/cpu.jsonl')]; b=[json.loads(l) for l in open('/tmp/cuda.jsonl')]
w=max(abs(x-y) for ra,rb in zip(a,b) for pa,pb in zip(ra['probs'],rb['probs']) for x,y in zip(pa,pb)) if a and b and 'probs' in a[0] and 'probs' in b[0] else None
print(sys.argv[1], 'max |cpu-cuda| =', w, 'cpu', a[0].get('probs',a[0])[0] if a else None, 'cuda', b[0].get('probs',b[0])[0] if b else None)
PY
done
