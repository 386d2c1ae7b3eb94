#!/usr/bin/env python3
"""server_hostile.py — `squad serve` against hostile clients (CTest server_hostile; docs/server.md, Limits).

    python3 tests/server_hostile.py path/to/squad

Starts the real server on free loopback ports with a tiny synthesized model (the real Qwen3
tokenizer) and checks, each against the property a change to the server must keep:
  1. flood: 300 slow connections from 5 source addresses (127.0.0.2-6) trickling header bytes; a
     normal client on 127.0.0.1 gets /health and /v1/ask within 1 s throughout; the slow
     connections are closed by the header deadline (however they trickle); after the attacker
     leaves, the normal client is answered within 1 s again; the start-up log sizes the connection
     limit from the file limit;
  2. --max-conns-per-ip: one address past its limit is refused while others are answered;
  3. the body budget: 40 connections each declaring a 3 MiB body against a 16 MiB budget: those
     past it get 503 with Retry-After at once, and the server's resident memory while the others
     hold nearly complete bodies grows by at most the budget plus a margin;
  4. HTTP edge cases: two different Content-Length headers -> 400 and close; HTTP/1.1 without Host
     -> 400; a chunk size of ffffffffffffffff (and any chunked body) -> 411 at once and close;
  5. keys: a wrong or missing key -> 401 at once, without reading the declared body;
  6. validation: the same bad bodies to /v1/ask, /v1/score, /v1/decisions and /v1/systemone get the
     same status and the same kind of message, in squad's words;
  7. a row too long names the tighter limit (--max-tokens below the model's positions) on every
     endpoint;
  8. a request past --timeout stops computing at the engine's next step; its log line counts what
     it computed;
  9. SIGTERM: a request still sending its body gets 503 once it is in, and the exit waits neither for
     it nor for one that never finishes its body (well within --timeout).
Python 3 standard library only; loopback only; about a minute.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import flood  # noqa: E402  (bench/flood.py: the attacker and the normal client)

SQUAD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/squad")
TOKENIZER = "third_party/qwen3/tokenizer.json"
KEY = "hostile-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAILS = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else f"  [{str(detail)[:300]}]"), flush=True)
    if not ok:
        FAILS.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, model, *extra):
        self.port = free_port()
        self.log_path = tempfile.mktemp(prefix="hostile-log-")
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen([SQUAD, "serve", "--model", model, "--port", str(self.port), *extra],
                                     stdout=self.logf, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 60:
            if self.proc.poll() is not None:
                break
            st, _ = flood.request(self.port, "GET", "/ready", timeout=2)
            if st == 200:
                return
            time.sleep(0.05)
        raise RuntimeError(f"squad serve did not become ready: {self.log()}")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def raw(port, data, wait=3.0, source="127.0.0.1"):
    """Sends raw bytes; returns (answer bytes, closed by the server, seconds to the answer)."""
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    s.settimeout(wait)
    t0 = time.time()
    s.sendall(data)
    out, closed, t_answer = b"", False, None
    try:
        while True:
            d = s.recv(65536)
            if not d:
                closed = True
                break
            if t_answer is None:
                t_answer = time.time() - t0
            out += d
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    s.close()
    return out, closed, t_answer if t_answer is not None else time.time() - t0


def status_of(out):
    m = re.match(rb"HTTP/1\.\d (\d{3})", out)
    return int(m.group(1)) if m else None


def make_model(tmp):
    model = os.path.join(tmp, "model")
    r = subprocess.run([SQUAD, "synth", "--preset", "tiny", "--out", model, "--tokenizer", TOKENIZER],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"squad synth: {r.stderr}")
    return model


def test_flood(srv):
    m = re.search(r"connections: at most (\d+) \(open files: soft limit (\d+), raised to (\d+), hard (\d+)\)", srv.log())
    check(m is not None, "flood: the log says the connection limit and the file limits", srv.log()[-600:])
    if m:
        limit, raised, hard = int(m.group(1)), int(m.group(3)), int(m.group(4))
        check(raised == hard, "flood: the soft file limit is raised to the hard one", m.group(0))
        check(limit >= min(1000, hard // 2), "flood: the connection limit follows the file limit", m.group(0))
    att = flood.Attacker(srv.port, 300, 5)
    att.thread.start()
    time.sleep(2)
    during = []
    t_end = time.time() + 11  # past the 10 s header deadline: the slow connections are closed
    k = 0
    while time.time() < t_end:
        path = "/health" if k % 2 == 0 else "/v1/ask"
        t = time.time()
        st, body = flood.request(srv.port, "GET" if k % 2 == 0 else "POST", path,
                                 None if k % 2 == 0 else flood.ASK, AUTH)
        during.append((path, st, time.time() - t, body))
        k += 1
        time.sleep(0.1)
    reopened = att.reopened
    att.leave()
    late = [d for d in during if d[1] != 200 or d[2] > 1.0]
    check(len(during) > 20 and not late, f"flood: 300 slow connections from 5 addresses: the normal client's {len(during)} "
          "requests all answered 200 within 1 s", late[:3])
    check(reopened >= 250, "flood: the slow connections are closed by the header deadline (trickling does not hold "
          f"them): {reopened} closed", reopened)
    after = flood.normal_client(srv.port, 2)
    # /v1/ask needs the key on this server: its 401 is an answer too
    bad = [a for a in after if a[1] is None or a[2] > 1.0]
    check(not bad, f"flood: after the attacker left, {len(after)} requests answered within 1 s", bad[:3])


def test_per_ip(srv):
    socks = []
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", srv.port), source_address=("127.0.0.9", 0))
        socks.append(s)
    time.sleep(0.3)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    st, _ = flood.request(srv.port, "GET", "/health")
    for s in socks:
        s.close()
    check(closed == 10, f"--max-conns-per-ip 20: 30 connections from one address, {closed} refused (10 expected)", closed)
    check(st == 200, "--max-conns-per-ip: another address is still answered", st)


def test_body_budget(srv):
    base = srv.rss_kb()
    size = 3 << 20
    held, refused, retry = [], 0, 0
    for i in range(40):
        s = socket.create_connection(("127.0.0.1", srv.port), source_address=(f"127.0.0.{20 + i % 10}", 0))
        s.sendall(f"POST /v1/ask HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {size}\r\n\r\n".encode())
        s.settimeout(0.3)
        try:
            out = s.recv(4096)
        except socket.timeout:
            out = None
        if out is None:
            held.append(s)
        else:
            refused += status_of(out) == 503
            retry += b"Retry-After:" in out
            s.close()
    chunk = b"x" * (64 << 10)
    for s in held:  # nearly complete bodies: all but 64 KiB
        s.settimeout(10)
        for _ in range(size // len(chunk) - 1):
            s.sendall(chunk)
    time.sleep(0.5)
    grown_mb = (srv.rss_kb() - base) / 1024
    check(len(held) <= 5 and refused == 40 - len(held) and retry == refused,
          f"body budget 16 MiB: {len(held)} bodies of 3 MiB received, {refused} refused 503 with Retry-After at once",
          (len(held), refused, retry))
    check(grown_mb < 16 + 12, f"body budget: the server's resident memory grew {grown_mb:.1f} MB with the bodies held "
          "(budget 16 MiB)", grown_mb)
    for s in held:
        s.close()
    time.sleep(0.3)
    st, _ = flood.request(srv.port, "POST", "/v1/ask", flood.ASK, AUTH, timeout=5)
    check(st == 200, "body budget: freed when the connections close (a request is answered)", st)


def test_http_edges(srv):
    out, closed, _ = raw(srv.port, b"POST /v1/ask HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                         b"\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}   xx")
    check(status_of(out) == 400 and closed, "two different Content-Length headers: 400 and the connection closed", out[:120])
    out, closed, _ = raw(srv.port, b"GET /health HTTP/1.1\r\n\r\n")
    check(status_of(out) == 400 and closed, "HTTP/1.1 without Host: 400", out[:120])
    out, closed, _ = raw(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    check(status_of(out) == 200, "HTTP/1.0 without Host: 200 (Host is HTTP/1.1's)", out[:120])
    out, closed, t = raw(srv.port, b"POST /v1/ask HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                         b"\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc")
    check(status_of(out) is not None and 400 <= status_of(out) < 500 and closed and t < 1.0,
          f"a chunk size of ffffffffffffffff: {status_of(out)} in {t:.2f} s and the connection closed", out[:120])
    out, closed, _ = raw(srv.port, b"POST /v1/ask HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                         b"\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    check(status_of(out) is not None and 400 <= status_of(out) < 500 and closed,
          "Content-Length with Transfer-Encoding: refused and closed", out[:120])


def test_keys(srv):
    for name, auth in (("a wrong key", "Authorization: Bearer nope\r\n"), ("no key", "")):
        out, _, t = raw(srv.port, f"POST /v1/ask HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 1000000\r\n\r\n".encode())
        check(status_of(out) == 401 and t < 1.0, f"{name}: 401 at once, the declared body unread ({t:.2f} s)", out[:120])


def test_deadline(model):
    """A request past --timeout stops computing at the engine's next step (the next request is not
    kept waiting behind it), and its log line counts the tokens it did compute."""
    srv = Server(model, "--timeout", "0.5", "--log-requests")
    try:
        row = {"ids": [7] * 150000, "slots": [149999], "nopts": [2], "letters": [1, 2]}
        t = time.time()
        st, _ = flood.request(srv.port, "POST", "/v1/score", json.dumps({"rows": [row]}), timeout=60)
        dt = time.time() - t
        short = {"ids": [7] * 10, "slots": [9], "nopts": [2], "letters": [1, 2]}
        t = time.time()
        st2, _ = flood.request(srv.port, "POST", "/v1/score", json.dumps({"rows": [short]}), timeout=60)
        dt2 = time.time() - t
        check(st == 503 and dt < 3, f"deadline: a 150k-token row past --timeout 0.5 gets 503 in {dt:.2f} s", (st, dt))
        check(st2 == 200 and dt2 < 1, f"deadline: the next request is answered in {dt2:.3f} s (the late row left the "
              "engine)", (st2, dt2))
        time.sleep(0.2)
        m = re.search(r"/v1/score 503 .* (\d+) tokens computed", srv.log())
        check(m is not None and int(m.group(1)) > 0, "deadline: the log counts the tokens the late request computed",
              m.group(0) if m else srv.log()[-400:])
    finally:
        srv.stop()


def test_sigterm(model):
    srv = Server(model, "--timeout", "30")
    stuck = socket.create_connection(("127.0.0.1", srv.port))  # never finishes its body
    stuck.sendall(b"POST /v1/ask HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"state\"")
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = flood.ASK.encode()
    s.sendall(f"POST /v1/ask HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:10])
    time.sleep(0.3)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    out = b""
    try:
        s.sendall(body[10:])
        s.settimeout(5)
        out = s.recv(4096)
    except OSError:
        pass
    try:
        srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        pass
    dt = time.time() - t0
    st = status_of(out)
    check(st == 503, f"SIGTERM: a request still sending its body gets 503 (got {st})", out[:120])
    check(srv.proc.poll() == 0 and dt < 5, f"SIGTERM: the exit does not wait for it ({dt:.1f} s, --timeout 30)",
          (srv.proc.poll(), dt))
    s.close()
    stuck.close()
    srv.stop()


# The same bad bodies to every endpoint: (name, body bytes, a phrase the message must have).
BAD_BODIES = [
    ("the body null", b"null", "must be a JSON object, not null"),
    ("an array", b"[1, 2]", "must be a JSON object, not an array"),
    ("a string", b'"x"', "must be a JSON object, not a string"),
    ("empty", b"", "is empty"),
    ("not JSON", b"{state: 1}", "is not valid JSON"),
    ("cut short", b'{"state": "a"', "not valid JSON (line 1, column 13): it ends before its value does"),
    ("text after", b'{"state": "a"} x', "more text after its value"),
    ("a duplicate key", b'{"state": "a", "state": "b"}', 'duplicate key "state"'),
    ("NUL in a string", b'{"state": "a\\u0000b"}', "NUL character"),
    ("an integer past 64 bits", b'{"state": 123456789012345678901234567890}', "number out of range"),
    ("a real past double", b'{"state": 1e999}', "number out of range"),
    ("invalid UTF-8", b'{"state": "\xff"}', "not valid UTF-8"),
]
ENDPOINTS = ["/v1/ask", "/v1/score", "/v1/decisions", "/v1/systemone"]
# A body each endpoint takes, to which an unknown field is added.
GOOD = {
    "/v1/ask": {"state": "Page", "questions": [{"text": "q", "options": ["a", "b"]}]},
    "/v1/score": {"rows": [{"ids": [1, 2, 3], "slots": [2], "nopts": [2], "letters": [4, 5]}]},
    "/v1/decisions": {"model": "model", "input": "Page", "questions": [{"type": "predicate", "instructions": "q"}]},
    "/v1/systemone": {"model": "model", "state": "Page", "questions": {"q": {"type": "noul", "instructions": "q"}}},
}


def message_of(body):
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None


def test_validation(srv):
    for name, body, phrase in BAD_BODIES:
        got = {}
        for ep in ENDPOINTS:
            st, out = flood.request(srv.port, "POST", ep, body, AUTH, timeout=5)
            got[ep] = (st, message_of(out) if st else out)
        statuses = {st for st, _ in got.values()}
        msgs = {m for _, m in got.values()}
        check(statuses == {400} and len(msgs) == 1 and phrase in next(iter(msgs)) and "JSON_" not in next(iter(msgs)),
              f"validation, {name}: 400 and the same message on every endpoint ({next(iter(msgs))!r})", got)
    for ep in ENDPOINTS:
        body = dict(GOOD[ep], bogus_field=1)
        st, out = flood.request(srv.port, "POST", ep, json.dumps(body), AUTH, timeout=10)
        msg = message_of(out) or ""
        check(st in (400, 422) and "bogus_field" in msg, f"validation, an unknown field on {ep}: {st}, named", (st, out[:200]))
    row = dict(GOOD["/v1/score"]["rows"][0], bogus_field=1)
    st, out = flood.request(srv.port, "POST", "/v1/score", json.dumps({"rows": [row]}), AUTH, timeout=10)
    res = json.loads(out)["results"][0] if st == 200 else {}
    check("bogus_field" in json.dumps(res.get("error", "")), "validation, an unknown field in a /v1/score row: "
          "that row's error names it", (st, out[:200]))
    for ep in ENDPOINTS:
        st, _ = flood.request(srv.port, "POST", ep, json.dumps(GOOD[ep]), AUTH, timeout=10)
        check(st == 200, f"validation: a good body on {ep} still answers 200", st)


def test_length_limit(srv):
    """A server with --max-tokens 32 (the model has far more positions): each endpoint's too-long
    error names --max-tokens and 32."""
    long_state = "word " * 80
    bodies = {
        "/v1/ask": {"state": long_state, "questions": [{"text": "q", "options": ["a", "b"]}]},
        "/v1/decisions": dict(GOOD["/v1/decisions"], input=long_state),
        "/v1/systemone": dict(GOOD["/v1/systemone"], state=long_state),
    }
    for ep, body in bodies.items():
        st, out = flood.request(srv.port, "POST", ep, json.dumps(body), timeout=10)
        msg = message_of(out) or ""
        check(st in (400, 422) and "at most 32 tokens (--max-tokens)" in msg, f"length on {ep}: the limit named ({msg!r})",
              (st, out[:200]))
    row = {"ids": [7] * 40, "slots": [39], "nopts": [2], "letters": [1, 2]}
    st, out = flood.request(srv.port, "POST", "/v1/score", json.dumps({"rows": [row]}), timeout=10)
    err = json.loads(out)["results"][0].get("error", "") if st == 200 else ""
    check("at most 32 tokens (--max-tokens)" in err, f"length on /v1/score: the row's error names the limit ({err!r})",
          (st, out[:200]))


def main():
    tmp = tempfile.mkdtemp(prefix="squad-hostile-")
    model = make_model(tmp)
    srv = Server(model, "--api-key", KEY, "--max-conns-per-ip", "100", "--max-inflight-body-mb", "16",
                 "--max-body", str(4 << 20), "--memo-mb", "0")
    try:
        test_http_edges(srv)
        test_keys(srv)
        test_body_budget(srv)
        test_flood(srv)
        test_validation(srv)
    finally:
        srv.stop()
    srv2 = Server(model, "--max-conns-per-ip", "20", "--max-tokens", "32")
    try:
        test_per_ip(srv2)
        test_length_limit(srv2)
    finally:
        srv2.stop()
    test_deadline(model)
    test_sigterm(model)
    if FAILS:
        print(f"server_hostile: {len(FAILS)} failed")
        sys.exit(1)
    print("server_hostile: all passed")


if __name__ == "__main__":
    main()
