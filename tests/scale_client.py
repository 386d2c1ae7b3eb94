#!/usr/bin/env python3
"""scale_client.py — an agent trace through a balancer in front of squad replicas, and its checks.

tests/scale_balancer.sh starts the replicas and the balancers; this client sends the traffic and
measures. The trace is seeded and deterministic: S agent sessions, each a state (a developer
message shared by every session, the session's goal and page) asked several questions one request
at a time (POST /v1/decisions), then grown by one action at its end (the action and its result
appended, as an agent's transcript grows), asked again, and so on. Sessions run concurrently
(--workers threads, each working through its sessions in order), as a fleet of agents would.

The session is named by the X-Squad-Session header (--key header), the body's prompt_cache_key
(--key body) or not at all (--key none). Each request is retried by the client on a clean 5xx or a
connection error, and both are counted: a balancer that retries for itself shows none.

    scale_client.py run --url URL --key header|body|none --summary FILE
                        [--replicas HOST:PORT,...] [--clear] [--ref FILE] [--write-ref FILE]
                        [--kill-pids HOST:PORT=PID,... --kill-after N] [--expect-affinity] [--expect-no-errors]
    scale_client.py latency --url URL [--n N] --summary FILE
    scale_client.py compare A.json B.json --at-least R   (B's hit tokens >= R x A's)

`run` prints a one-line summary and writes it as JSON; with --replicas it reads each replica's
/metrics before and after (its cache counters' deltas are the per-replica cache statistics; --clear
drops the replicas' caches first). The checks (exit status 1 when one fails, each failure printed):
  --expect-affinity   every session answered by one replica only (after --kill-pids, a session of
                      the killed replica may move once, to one other replica), and each replica's
                      engine rows (its /metrics) equal the questions the answers say it answered
  --expect-no-errors  no request failed for good and no connection error reached the client
  --ref FILE          every answer equal to the reference run's within TOL_CACHED
"""
import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

TOL_CACHED = 1e-4  # tests/tolerances.h TOL_CPU_EXACT_CACHED: cached against uncached on the CPU
ATTEMPTS = 6  # client attempts per request (the first and five retries)
RETRY_PAUSE_S = 0.2

SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "dan", "pi", "qua", "ze", "bor", "ni", "fe"]


def word_list(rng, n):
    return ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def text(rng, words, lo, hi):
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))


def make_trace(seed, sessions, states, questions):
    """[(session id, [request body, ...]), ...]: each body a /v1/decisions request without the key."""
    rng = random.Random(seed)
    words = word_list(rng, 400)
    developer = "You are a careful agent testing a web application. " + text(rng, words, 40, 40)
    trace = []
    for s in range(sessions):
        sid = f"agent-{seed}-{s}"
        goal = "Goal: " + text(rng, words, 15, 30)
        page = "Current page:\n" + text(rng, words, 300, 420)
        transcript = ""
        bodies = []
        for k in range(states):
            if k:  # the state grows at its end by one action and what it did
                transcript += f"\nAction {k}: click {rng.choice(words)}\nResult: " + text(rng, words, 25, 60)
            state = goal + "\n" + page + transcript
            for q in range(rng.randint(questions[0], questions[1])):
                if rng.random() < 0.5:
                    question = {"type": "predicate", "name": f"q{q}", "instructions": text(rng, words, 5, 10) + "?"}
                else:
                    question = {"type": "choice", "name": f"q{q}", "instructions": text(rng, words, 5, 10) + "?",
                                "choices": [{"value": text(rng, words, 1, 3)} for _ in range(rng.randint(2, 4))]}
                bodies.append({"input": [{"role": "developer", "content": developer},
                                         {"role": "user", "content": state}],
                               "questions": [question]})
        trace.append((sid, bodies))
    return trace


def answer_numbers(answer_body):
    """The answer's probabilities as a flat list (what must not change from replica to replica)."""
    out = []
    for a in answer_body.get("answers", []):
        if "probability" in a:
            out.append(a["probability"])
        for p in a.get("probabilities", []):
            out.append(p["probability"])
    return out


def replica_of(headers):
    """(the replica that answered, as squad's X-Squad-Replica names it; the balancer's choice, as its
    X-Squad-Upstream names it: nginx lists every upstream it tried, the last one answered; "" when
    the answer came directly)."""
    upstream = (headers.get("X-Squad-Upstream") or "").split(",")[-1].strip()
    return headers.get("X-Squad-Replica") or "", upstream


def post(url, path, body, headers):
    """One attempt: (status, parsed body or None, response headers); raises on a connection error."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as res:
            return res.status, json.loads(res.read()), res.headers
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, None, e.headers


def metrics(addr):
    """squad's counters on one replica: {name: value} for the unlabelled lines."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as res:
        out = {}
        for line in res.read().decode().splitlines():
            if line.startswith("squad_") and "{" not in line:
                name, _, value = line.partition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out


def clear(addr):
    req = urllib.request.Request(f"http://{addr}/v1/cache/clear", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=30) as res:
        res.read()


def percentile(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


class Run:
    """One pass of the trace: the records, the counters and the kill switch, shared by the workers."""

    def __init__(self, args, trace, model):
        self.args, self.trace, self.model = args, trace, model
        self.lock = threading.Lock()
        self.records = []
        self.done = 0
        self.kill_t = None
        self.killed = None
        self.t0 = time.perf_counter()

    def maybe_kill(self):
        """After --kill-after answers, SIGKILL the replica that answered the most sessions so far
        with the most sessions under way (hashing may leave a replica with few or none: killing it
        would test nothing)."""
        with self.lock:
            self.done += 1
            if not self.args.kill_pids or self.kill_t is not None or self.done < self.args.kill_after:
                return
            pids = dict(kv.split("=") for kv in self.args.kill_pids.split(","))
            latest = {}  # session -> its latest answer
            for r in self.records:
                if r["status"] == 200 and r["replica"] in pids:
                    latest[r["session"]] = r
            open_sessions = {a: 0 for a in pids}
            for r in latest.values():
                open_sessions[r["replica"]] += r["seq"] + 1 < r["of"]
            self.killed = max(open_sessions, key=lambda a: open_sessions[a])
            os.kill(int(pids[self.killed]), signal.SIGKILL)
            self.kill_t = time.perf_counter() - self.t0

    def request(self, sid, seq, of, body):
        headers = {}
        if self.args.key == "header":
            headers["X-Squad-Session"] = sid
        body = dict(body, model=self.model)
        if self.args.key == "body":
            body["prompt_cache_key"] = sid
        rec = {"session": sid, "seq": seq, "of": of, "status": 0, "clean_5xx": 0, "conn_errors": 0}
        t = time.perf_counter()
        for attempt in range(ATTEMPTS):
            try:
                status, out, hdrs = post(self.args.url, "/v1/decisions", body, headers)
            except (OSError, http.client.HTTPException) as e:
                rec["conn_errors"] += 1
                rec["last_error"] = str(e)
                time.sleep(RETRY_PAUSE_S * (attempt + 1))
                continue
            rec["status"] = status
            if status >= 500:
                rec["clean_5xx"] += 1
                time.sleep(RETRY_PAUSE_S * (attempt + 1))
                continue
            if status == 200:
                rec["replica"], rec["upstream"] = replica_of(hdrs)
                rec["answers"] = answer_numbers(out)
                u = out["usage"]
                rec["input_tokens"] = u["input_tokens"]
                rec["cached_tokens"] = u["input_tokens_details"]["cached_tokens"]
                rec["rows"] = len(body["questions"])
            break
        rec["t_start"] = t - self.t0
        rec["t_end"] = time.perf_counter() - self.t0
        rec["ms"] = (time.perf_counter() - t) * 1e3
        with self.lock:
            self.records.append(rec)
        self.maybe_kill()

    def worker(self, w):
        for i in range(w, len(self.trace), self.args.workers):
            sid, bodies = self.trace[i]
            for seq, body in enumerate(bodies):
                self.request(sid, seq, len(bodies), body)
                time.sleep(self.args.think_ms / 1000.0)  # the agent reads the answer and acts

    def go(self):
        threads = [threading.Thread(target=self.worker, args=(w,)) for w in range(self.args.workers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - self.t0


def check_affinity(records, kill_t, killed, settle_s, per_replica, problems):
    """Each session on one replica; the replicas' own row counts agree with where the answers say
    they were answered. With a kill at kill_t: a session another replica held never moves
    (consistent hashing moves only the dead one's sessions); a session the killed replica held
    moves, and from settle_s after the kill (the balancer has taken the replica out) it stays on one
    replica; until then retries may land on any live one. Returns the sessions moved."""
    phases = {}  # session -> replicas before the kill, until settle_s after it, later
    for r in records:
        if r["status"] != 200:
            continue
        p = phases.setdefault(r["session"], {"before": set(), "window": set(), "after": set()})
        if kill_t is None or r["t_end"] < kill_t:
            p["before"].add(r["replica"])
        elif r["t_start"] < kill_t:  # under way at the kill: the dead replica may have answered first
            p["window"].add(r["replica"])
            if r["replica"] == killed:
                p["before"].add(r["replica"])
        elif r["t_start"] <= kill_t + settle_s:
            p["window"].add(r["replica"])
        else:
            p["after"].add(r["replica"])
    moved = 0
    for sid, p in sorted(phases.items()):
        seen = {k: sorted(v) for k, v in p.items()}
        if len(p["before"]) > 1 or len(p["after"]) > 1:
            problems.append(f"session {sid} on several replicas: {seen} (killed: {killed})")
        elif p["before"] and p["before"] != {killed}:
            if (p["window"] | p["after"]) - p["before"]:
                problems.append(f"session {sid} of a live replica moved: {seen} (killed: {killed})")
        elif killed in (p["window"] | p["after"]) - p["before"]:
            problems.append(f"session {sid} answered by the killed replica after the kill: {seen}")
        elif p["before"] == {killed} and (p["window"] | p["after"]) - {killed}:
            moved += 1
    if per_replica:
        counted = {}
        for r in records:
            if r["status"] == 200:
                counted[r["replica"]] = counted.get(r["replica"], 0) + r["rows"]
        for addr, d in per_replica.items():
            if d is None:  # the killed replica: its metrics are gone with it
                continue
            if int(d["rows"]) != counted.get(addr, 0):
                problems.append(f"replica {addr}: its /metrics count {int(d['rows'])} rows, the answers "
                                f"name it for {counted.get(addr, 0)}")
    return moved


def cmd_run(args):
    trace = make_trace(args.seed, args.sessions, args.states, (args.questions_min, args.questions_max))
    with urllib.request.urlopen(args.url + "/v1/models", timeout=30) as res:
        model = json.loads(res.read())["data"][0]["id"]
    replicas = [a for a in args.replicas.split(",") if a] if args.replicas else []
    if args.clear:
        for a in replicas:
            clear(a)
    before = {a: metrics(a) for a in replicas}
    run = Run(args, trace, model)
    wall = run.go()
    recs = run.records
    killed = run.killed
    per_replica = {}
    for a in replicas:
        try:
            m = metrics(a)
        except OSError:
            per_replica[a] = None
            continue
        per_replica[a] = {"rows": m.get("squad_rows_submitted_total", 0) - before[a].get("squad_rows_submitted_total", 0),
                          "reused": m.get("squad_cache_tokens_reused_total", 0) - before[a].get("squad_cache_tokens_reused_total", 0),
                          "computed": m.get("squad_cache_tokens_computed_total", 0) - before[a].get("squad_cache_tokens_computed_total", 0)}
    ok = [r for r in recs if r["status"] == 200]
    problems = []
    summary = {
        "label": args.label, "requests": len(recs), "ok": len(ok), "sessions": args.sessions,
        "failed": len(recs) - len(ok),
        "conn_errors": sum(r["conn_errors"] for r in recs), "clean_5xx": sum(r["clean_5xx"] for r in recs),
        "input_tokens": sum(r["input_tokens"] for r in ok), "cached_tokens": sum(r["cached_tokens"] for r in ok),
        "wall_s": round(wall, 3), "req_per_s": round(len(ok) / wall, 2) if wall else 0,
        "p50_ms": round(percentile([r["ms"] for r in ok], 50), 2),
        "p99_ms": round(percentile([r["ms"] for r in ok], 99), 2),
        "per_replica": per_replica,
    }
    summary["hit_rate"] = round(summary["cached_tokens"] / summary["input_tokens"], 4) if summary["input_tokens"] else 0
    live = [d for d in per_replica.values() if d]
    summary["replica_reused_tokens"] = int(sum(d["reused"] for d in live))
    for r in ok:  # squad's own name of the replica and the balancer's must agree
        if not r["replica"]:
            problems.append(f"{r['session']}/{r['seq']}: no X-Squad-Replica header on the answer")
            break
        if r["upstream"] and r["upstream"] != r["replica"]:
            problems.append(f"{r['session']}/{r['seq']}: X-Squad-Replica {r['replica']} but the balancer says "
                            f"{r['upstream']}")
            break
    if args.expect_affinity:
        summary["sessions_moved"] = check_affinity(recs, run.kill_t, killed, args.settle, per_replica, problems)
    else:  # how many sessions the balancer spread (reported for round robin)
        reps = {}
        for r in ok:
            reps.setdefault(r["session"], set()).add(r["replica"])
        summary["sessions_on_several_replicas"] = sum(1 for s in reps.values() if len(s) > 1)
    if args.kill_pids:
        summary["killed"] = killed
        summary["kill_at_s"] = round(run.kill_t or 0, 3)
        # recovery: each session the killed replica held is back in a cache once its first answer
        # from its final replica has come (that request computed the state again)
        final = {}
        held = set()
        for r in sorted(ok, key=lambda r: r["t_end"]):
            final[r["session"]] = r["replica"]
            if run.kill_t is not None and r["t_end"] < run.kill_t and r["replica"] == killed:
                held.add(r["session"])
        back = {}
        for r in sorted(ok, key=lambda r: r["t_end"]):
            if r["session"] in held and r["replica"] == final[r["session"]] and r["session"] not in back:
                back[r["session"]] = r["t_end"]
        summary["recover_s"] = round(max(back.values()) - run.kill_t, 3) if back else None
        after = [r for r in ok if run.kill_t and r["t_start"] > run.kill_t]
        summary["hit_rate_after_kill"] = round(sum(r["cached_tokens"] for r in after) /
                                               max(1, sum(r["input_tokens"] for r in after)), 4)
    if args.kill_pids and run.kill_t is not None and not any(r["t_start"] > run.kill_t + args.settle for r in ok):
        problems.append(f"no request started {args.settle} s after the kill: the trace ended too soon to check "
                        "that the sessions settled (raise --think-ms)")
    if args.kill_pids and args.expect_affinity and not summary["sessions_moved"]:
        problems.append("no session of the killed replica was seen on another replica after the kill "
                        "(the trace ended too soon after it?)")
    if args.expect_no_errors:
        if summary["failed"]:
            problems.append(f"{summary['failed']} requests failed for good: " +
                            "; ".join(f"{r['session']}/{r['seq']}: {r['status']} {r.get('last_error', '')}"
                                      for r in recs if r["status"] != 200)[:600])
        if summary["conn_errors"]:
            problems.append(f"{summary['conn_errors']} connection errors reached the client")
    answers = {f"{r['session']}/{r['seq']}": r["answers"] for r in ok}
    if args.write_ref:
        with open(args.write_ref, "w") as f:
            json.dump(answers, f)
    if args.ref:
        with open(args.ref) as f:
            ref = json.load(f)
        worst, differ, missing = 0.0, 0, 0
        for k, v in answers.items():
            if k not in ref or len(ref[k]) != len(v):
                missing += 1
                continue
            d = max((abs(a - b) for a, b in zip(v, ref[k])), default=0.0)
            worst = max(worst, d)
            differ += d > TOL_CACHED
        summary["answers_compared"] = len(answers) - missing
        summary["answers_max_diff"] = worst
        if differ or missing or len(answers) != len(ref):
            problems.append(f"answers against the single replica's: {differ} differ by more than {TOL_CACHED} "
                            f"(worst {worst:.2e}), {missing} without a reference, {len(answers)} of {len(ref)} answered")
    with open(args.summary, "w") as f:
        json.dump(summary, f)
    brief = {k: v for k, v in summary.items() if k != "per_replica"}
    brief["replica_rows"] = [int(d["rows"]) if d else None for d in per_replica.values()]
    print("scale:", json.dumps(brief))
    for p in problems:
        print(f"scale: FAIL ({args.label}): {p}")
    return 1 if problems else 0


def cmd_latency(args):
    """Per-request latency of one small request answered by the request memo (tens of microseconds
    of squad's own time), over a kept-alive connection: through a balancer it measures the hop."""
    host, _, port = args.url.split("//")[1].partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    body = json.dumps({"model": model, "input": [{"role": "user", "content": "Is the page loaded?"}],
                       "questions": [{"type": "predicate", "name": "loaded", "instructions": "Loaded?"}]}).encode()
    hdrs = {"Content-Type": "application/json", "X-Squad-Session": "latency"}
    times = []
    for i in range(args.n + 5):
        t = time.perf_counter()
        conn.request("POST", "/v1/decisions", body, hdrs)  # bytes: one send with the headers
        res = conn.getresponse()
        res.read()
        if res.status != 200:
            print(f"scale: latency: {res.status}")
            return 1
        if i >= 5:  # the first ones warm the memo and the connection
            times.append((time.perf_counter() - t) * 1e3)
    summary = {"label": args.label, "n": args.n, "p50_ms": round(percentile(times, 50), 3),
               "p99_ms": round(percentile(times, 99), 3)}
    with open(args.summary, "w") as f:
        json.dump(summary, f)
    print("scale:", json.dumps(summary))
    return 0


def cmd_compare(args):
    with open(args.base) as f:
        a = json.load(f)
    with open(args.other) as f:
        b = json.load(f)
    ratio = b["replica_reused_tokens"] / max(1, a["replica_reused_tokens"])
    ok = ratio >= args.at_least if args.at_least is not None else ratio < args.below
    what = f">= {args.at_least}" if args.at_least is not None else f"< {args.below}"
    print(f"scale: {b['label']} reused {b['replica_reused_tokens']} tokens = {ratio:.3f} x {a['label']}'s "
          f"{a['replica_reused_tokens']} (want {what}): {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--label", default="run")
    r.add_argument("--key", choices=["header", "body", "none"], default="header")
    r.add_argument("--replicas", default="")
    r.add_argument("--clear", action="store_true")
    r.add_argument("--seed", type=int, default=7)
    r.add_argument("--sessions", type=int, default=12)
    r.add_argument("--states", type=int, default=3)
    r.add_argument("--questions-min", type=int, default=2)
    r.add_argument("--questions-max", type=int, default=3)
    r.add_argument("--workers", type=int, default=6)
    r.add_argument("--think-ms", type=float, default=0.0, help="an agent's pause after each answer")
    r.add_argument("--kill-pids", default="", help="HOST:PORT=PID,...: the replicas one of which to kill")
    r.add_argument("--kill-after", type=int, default=0, help="kill after this many answered requests")
    r.add_argument("--settle", type=float, default=3.0,
                   help="seconds after the kill for the balancer to take the replica out")
    r.add_argument("--expect-affinity", action="store_true")
    r.add_argument("--expect-no-errors", action="store_true")
    r.add_argument("--ref")
    r.add_argument("--write-ref")
    r.add_argument("--summary", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--url", required=True)
    lat.add_argument("--label", default="latency")
    lat.add_argument("--n", type=int, default=200)
    lat.add_argument("--summary", required=True)
    c = sub.add_parser("compare")
    c.add_argument("base")
    c.add_argument("other")
    c.add_argument("--at-least", type=float)
    c.add_argument("--below", type=float)
    args = ap.parse_args()
    return {"run": cmd_run, "latency": cmd_latency, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
