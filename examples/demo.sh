#!/usr/bin/env bash
# demo.sh — the main job (`make run` calls `bash examples/demo.sh build/squad`): prepares a demo model
# once (a small synthesized Qwen3.5-architecture model with the real Qwen tokenizer, in demo-model/)
# and answers every request in examples/*.json with `squad ask`, printing each question, its options
# with their probabilities, the answer and the timing.
#
# A synthesized model has random weights: its answers are arbitrary. The point is the pipeline (text,
# tokenizer, template, state cache, engine). To use a real checkpoint, see the note printed at the end.
set -euo pipefail
SQUAD="${1:-build/squad}"
cd "$(dirname "$0")/.."
MODEL="${SQUAD_DEMO_MODEL:-demo-model}"
TOKENIZER=third_party/qwen3/tokenizer.json

if [ ! -x "$SQUAD" ]; then
  echo "demo: $SQUAD not found; build it first (make)" >&2
  exit 2
fi
if [ ! -f "$TOKENIZER" ]; then
  bash tools/fetch_test_data.sh
fi
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  echo "demo: preparing $MODEL/ (squad synth --preset demo with the Qwen3 tokenizer; done once)"
  "$SQUAD" synth --preset demo --out "$MODEL" --tokenizer "$TOKENIZER"
fi

cat <<NOTE

NOTE: $MODEL/ is a synthesized model with random weights, so the answers below are arbitrary.
      They show the pipeline working: text -> tokens (Qwen tokenizer) -> rows (prompt template)
      -> the engine with its state cache -> probabilities per option.
NOTE

# Prints one request and its answer readably (node is installed with the build dependencies).
show() {
  node -e '
    const fs = require("fs");
    const req = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const out = JSON.parse(process.argv[2]);
    if (out.error) { console.log("  error: " + out.error); process.exit(1); }
    const firstLine = req.state.split("\n").find((l) => l.trim()) || "";
    console.log(`state: ${req.state.length} characters, ${out.tokens.state} tokens  (${firstLine.slice(0, 70)})`);
    req.questions.forEach((q, i) => {
      const a = out.answers[i];
      console.log(`\nQ${i + 1}. ${q.text}`);
      q.options.forEach((o, k) => {
        const mark = k === a.index ? "->" : "  ";
        const label = String.fromCharCode(65 + k);
        console.log(`   ${mark} ${label}. ${o.padEnd(40)} ${(100 * a.probs[k]).toFixed(1).padStart(5)}%`);
      });
      console.log(`   answer: ${a.choice}`);
    });
    console.log(`\ntokens computed ${out.tokens.computed}, reused from the state cache ${out.tokens.reused}; ${out.ms} ms`);
  ' "$1" "$2"
}

status=0
for req in examples/*.json; do
  echo "==================================================================================="
  echo "$req"
  echo "==================================================================================="
  if out="$("$SQUAD" ask --model "$MODEL" --request "$req")"; then
    show "$req" "$out"
  else
    echo "  squad ask failed: $out"
    status=1
  fi
  echo
done

cat <<NOTE
To answer with a real model, put a Qwen3.5 checkpoint in a directory (config.json, the
*.safetensors files and tokenizer.json, e.g. from the Hugging Face repository Qwen/Qwen3.5-0.8B)
and point --model at it:
    $SQUAD ask --model /path/to/Qwen3.5-0.8B --request examples/login.json
The tokenizer.json in that directory is used automatically (--tokenizer overrides it), and a
squad-template.json there overrides the prompt template (README.md, "Prompt template").
NOTE
exit $status
