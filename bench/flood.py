#!/usr/bin/env python3
"""flood.py — a slow-connection flood against a running `squad serve`, and what a normal client sees.

    python3 bench/flood.py --port 8080 [--conns 1500] [--addrs 49] [--seconds 20] [--after 5]

The attacker opens --conns connections from --addrs loopback source addresses (127.0.0.2 onwards,
bound explicitly), each starting a request and then trickling one header byte a second, and opens
a new one whenever the server closes one, for --seconds. Meanwhile a normal client on 127.0.0.1
asks GET /health and POST /v1/ask in turn, each on a new connection with a 1 s timeout. Then the
attacker leaves (closes everything) and the normal client goes on for --after seconds.
Printed (and returned by flood()): the normal client's answers and p99 latency during the flood and
after it, and the connections the attacker held at the end. Loopback only; bounded in connections
and time. Python 3 standard library only (tests/server_hostile.py imports it).
"""
import argparse
import json
import socket
import threading
import time

ASK = json.dumps({"state": "Page: Login", "questions": [{"text": "Is the form complete?", "options": ["yes", "no"]}]})
NORMAL_TIMEOUT_S = 1.0


def request(port, method, path, body=None, headers=None, timeout=NORMAL_TIMEOUT_S, source="127.0.0.1"):
    """One request on a new connection: (status, body bytes), or (None, reason) on a timeout or error."""
    data = body.encode() if isinstance(body, str) else body
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if data is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    raw = ("\r\n".join(head) + "\r\n\r\n").encode() + (data or b"")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    except OSError as e:
        return None, f"connect: {e}"
    try:
        s.settimeout(timeout)
        s.sendall(raw)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        s.close()
    if not out.startswith(b"HTTP/1."):
        return None, f"no answer ({out[:40]!r})"
    head, _, rest = out.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


class Attacker:
    """Slow connections from several source addresses, kept at a count, trickling header bytes."""

    def __init__(self, port, conns, addrs):
        self.port, self.target, self.addrs = port, conns, addrs
        self.socks = []
        self.stop = threading.Event()
        self.reopened = 0
        self.refused = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self, i):
        src = f"127.0.0.{2 + i % self.addrs}"
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.bind((src, 0))
            try:
                s.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            return s
        except OSError:
            self.refused += 1
            return None

    def run(self):
        i = 0
        while len(self.socks) < self.target and not self.stop.is_set():
            s = self.open_one(i)
            i += 1
            if s:
                self.socks.append([s, 0])
        msg = b"POST /v1/ask HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000
        while not self.stop.is_set():
            t0 = time.time()
            for k, entry in enumerate(self.socks):
                if self.stop.is_set():
                    break
                s, sent = entry
                try:
                    n = s.send(msg[sent:sent + 1])
                    entry[1] = min(sent + n, len(msg) - 1)
                except BlockingIOError:
                    pass
                except OSError:  # closed by the server: open another, as an attacker would
                    s.close()
                    ns = self.open_one(i)
                    i += 1
                    self.reopened += 1
                    if ns:
                        self.socks[k] = [ns, 0]
            self.stop.wait(max(0.0, 1.0 - (time.time() - t0)))

    def held(self):
        n = 0
        for s, _ in self.socks:
            try:
                if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    continue
            except BlockingIOError:
                pass
            except OSError:
                continue
            n += 1
        return n

    def leave(self):
        self.stop.set()
        self.thread.join()
        for s, _ in self.socks:
            s.close()
        self.socks = []


def p99(xs):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def normal_client(port, seconds, gap=0.1):
    """Asks /health and /v1/ask in turn for seconds: [(path, status or None, latency s)]."""
    out = []
    end = time.time() + seconds
    k = 0
    while time.time() < end:
        path = "/health" if k % 2 == 0 else "/v1/ask"
        t = time.time()
        st, _ = request(port, "GET" if path == "/health" else "POST", path, None if path == "/health" else ASK)
        out.append((path, st, time.time() - t))
        k += 1
        time.sleep(gap)
    return out


def summary(samples):
    ok = [lat for _, st, lat in samples if st == 200 and lat <= NORMAL_TIMEOUT_S]
    return {"asked": len(samples), "answered_within_1s": len(ok), "p99_ms": round(p99([lat for _, _, lat in samples]) * 1000, 1)}


def flood(port, conns=1500, addrs=49, seconds=20.0, after=5.0, ramp=5.0):
    att = Attacker(port, conns, addrs)
    att.thread.start()
    time.sleep(ramp)  # the connections open and start trickling
    during = normal_client(port, seconds)
    held = att.held()
    att.leave()
    afterwards = normal_client(port, after)
    res = {"conns": conns, "addrs": addrs, "held_at_end": held, "reopened": att.reopened,
           "during": summary(during), "after": summary(afterwards)}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=1500)
    ap.add_argument("--addrs", type=int, default=49)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--after", type=float, default=5.0)
    a = ap.parse_args()
    if not (0 < a.conns <= 5000 and 0 < a.addrs <= 200 and 0 < a.seconds <= 300 and 0 < a.after <= 60):
        ap.error("bounds: --conns 1..5000, --addrs 1..200, --seconds 1..300, --after 1..60")
    print(json.dumps(flood(a.port, a.conns, a.addrs, a.seconds, a.after), indent=1))


if __name__ == "__main__":
    main()
