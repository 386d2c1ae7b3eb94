#!/usr/bin/env python3
"""agent_trace.py — a deterministic, seeded trace of the rows an agent sends squad (state-cache workload).

An agent works on a goal step by step and asks several multiple-choice questions about each state
before it acts. Its state, as it sends it (docs/design.md section 5), is laid out as

    [system header | goal | step 1 | ... | step k | page | footer]

and every row is that state followed by one question ([question | options | answer marker], the
answer slots at the end), with "state_len" set to the state's length. Between questions the session
moves on in one of the ways an agent's state changes:
  - an action: a step is appended to the history and a new page replaces the old one (the state is
    shared up to the end of the old history: a change "in the middle", after the same goal and steps);
  - a page update: part of the page changes from some point on (a dynamic element, a form filled);
  - a page growth: content is appended to the page (more results loaded): the state grows at its end,
    just before the short footer.
Many sessions are live at once and their rows interleave; a finished session is replaced by a new
one (a new goal) until the total is reached. Token ids are random within the vocabulary, but every
shared part (the header, a session's goal, its history, an unchanged page) is the same ids each time,
as a tokenizer would give them.

Usage: agent_trace.py [--seed N] [--sessions N] [--live N] [--steps N] [--questions A,B] [--vocab V]
                      [--header N] [--goal A,B] [--step A,B] [--page A,B] [--question A,B]
                      [--max-state N] [--out FILE]
Writes JSON lines {"ids", "slots", "nopts", "letters", "state_len"} (stdout without --out) and a
one-line summary on stderr.
"""
import argparse
import json
import random
import sys

# the last token ids of the vocabulary serve as option letters and markers (a template's fixed tokens)
N_LETTERS = 4
MARKERS = 3  # answer marker, option separator, footer token


def span(text):
    a, b = (int(x) for x in text.split(","))
    if a > b or a < 0:
        raise argparse.ArgumentTypeError(f"bad range {text}: want A,B with 0 <= A <= B")
    return a, b


class Session:
    """One agent working on one goal: its history, its current page and its remaining steps."""

    def __init__(self, rng, args, vocab_words, header):
        self.rng = rng
        self.args = args
        self.words = vocab_words
        self.header = header
        self.goal = self.toks(args.goal)
        self.history = []  # one token list per step taken
        self.page = self.toks(args.page)
        self.steps_left = args.steps
        self.questions_left = self.rng.randint(*args.questions)

    def toks(self, rng_range):
        return [self.rng.randrange(self.words) for _ in range(self.rng.randint(*rng_range))]

    def state(self, footer):
        s = list(self.header) + self.goal
        for step in self.history:
            s += step
        return s + self.page + footer

    def advance(self):
        """The next state after the questions about this one; False when the session is over."""
        self.steps_left -= 1
        if self.steps_left <= 0:
            return False
        r = self.rng.random()
        if r < self.args.p_update and len(self.page) > 8:  # part of the page changes
            at = self.rng.randrange(len(self.page) // 4, len(self.page))
            self.page = self.page[:at] + self.toks((len(self.page) - at, len(self.page) - at))
        elif r < self.args.p_update + self.args.p_grow:  # the page grows at its end
            self.page += self.toks(self.args.grow)
        else:  # an action: one more step, a new page
            self.history.append(self.toks(self.args.step))
            self.page = self.toks(self.args.page)
        while self.history and len(self.state([])) > self.args.max_state:  # the agent trims old steps
            self.history.pop(0)
        self.questions_left = self.rng.randint(*self.args.questions)
        return True


def question_row(rng, args, state, letters, marker, sep):
    """state + [question | option 1 | sep | option 2 | ... | marker]: one answer slot (sometimes two)."""
    q = [rng.randrange(args.vocab - N_LETTERS - MARKERS) for _ in range(rng.randint(*args.question))]
    nopts = rng.randint(2, N_LETTERS)
    suffix = list(q)
    for _ in range(nopts):
        suffix += [rng.randrange(args.vocab - N_LETTERS - MARKERS) for _ in range(rng.randint(2, 6))] + [sep]
    slots_rel = []
    if rng.random() < args.p_two_slots:  # a second question answered inside the same row
        suffix.append(marker)
        slots_rel.append(len(suffix) - 1)
        suffix += [rng.randrange(args.vocab - N_LETTERS - MARKERS) for _ in range(rng.randint(4, 12))]
    suffix.append(marker)
    slots_rel.append(len(suffix) - 1)
    ids = state + suffix
    slots = [len(state) + s for s in slots_rel]
    return {"ids": ids, "slots": slots, "nopts": [nopts] * len(slots), "letters": letters,
            "state_len": len(state)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=24, help="sessions in all")
    ap.add_argument("--live", type=int, default=6, help="sessions interleaved at once")
    ap.add_argument("--steps", type=int, default=8, help="states per session")
    ap.add_argument("--questions", type=span, default=(2, 5), help="questions per state")
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--header", type=int, default=120, help="system header tokens (shared by all sessions)")
    ap.add_argument("--goal", type=span, default=(40, 120))
    ap.add_argument("--step", type=span, default=(20, 60), help="tokens per history step")
    ap.add_argument("--page", type=span, default=(400, 1200), help="tokens per page")
    ap.add_argument("--grow", type=span, default=(30, 120), help="tokens a page grows by")
    ap.add_argument("--question", type=span, default=(12, 40), help="question tokens")
    ap.add_argument("--footer", type=int, default=6, help="state footer tokens")
    ap.add_argument("--p-update", type=float, default=0.2, help="chance a step updates part of the page")
    ap.add_argument("--p-grow", type=float, default=0.15, help="chance a step grows the page")
    ap.add_argument("--p-two-slots", type=float, default=0.2)
    ap.add_argument("--max-state", type=int, default=3500, help="the agent trims old steps beyond this")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.vocab < 64:
        ap.error("--vocab must be at least 64")

    rng = random.Random(args.seed)
    words = args.vocab - N_LETTERS - MARKERS
    letters = list(range(args.vocab - N_LETTERS, args.vocab))
    marker, sep, foot = args.vocab - N_LETTERS - 1, args.vocab - N_LETTERS - 2, args.vocab - N_LETTERS - 3
    footer = [foot] * args.footer
    header = [rng.randrange(words) for _ in range(args.header)]

    started = 0
    live = []
    while started < args.sessions and len(live) < args.live:
        live.append(Session(random.Random(rng.getrandbits(64)), args, words, header))
        started += 1
    rows = []
    while live:
        i = rng.randrange(len(live))
        s = live[i]
        rows.append(question_row(rng, args, s.state(footer), letters, marker, sep))
        s.questions_left -= 1
        if s.questions_left <= 0 and not s.advance():
            if started < args.sessions:
                live[i] = Session(random.Random(rng.getrandbits(64)), args, words, header)
                started += 1
            else:
                live.pop(i)

    out = open(args.out, "w") if args.out else sys.stdout
    for r in rows:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
    if args.out:
        out.close()
    n_tok = sum(len(r["ids"]) for r in rows)
    n_state = sum(r["state_len"] for r in rows)
    print(f"agent_trace: {len(rows)} rows, {args.sessions} sessions ({args.live} live), {n_tok} tokens, "
          f"{n_state} state tokens, longest row {max(len(r['ids']) for r in rows)}", file=sys.stderr)


if __name__ == "__main__":
    main()
