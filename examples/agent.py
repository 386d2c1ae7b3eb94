#!/usr/bin/env python3
"""agent.py — an agent session against `squad serve`, with the Python standard library only.

A web-testing agent looks at a page, asks several questions about it, acts, asks again about the
changed page, then reaches a new page. Every step is one POST /v1/decisions request (the OpenAI
Decisions API shape that squad serves; docs/decisions-api.md section A) whose input is the agent's whole
state: its instructions (a developer message), the history of its actions and the current page. The
state grows at its end from step to step, so squad's state cache restores the part it has seen and
computes only what is new; each step prints its answers, its latency and how many input tokens came
from the cache ("cached") or were computed.

    python3 examples/agent.py [--url http://127.0.0.1:8080] [--api-key KEY] [--model NAME]

Without --model it asks GET /v1/models for the served model's name. Exit status 0 when every step
got an answer, 1 otherwise.
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request

AGENT = ("You are a careful QA agent testing a web application. You get the history of your actions "
         "and the current page; answer about the page.")

LOGIN_PAGE = """URL: https://app.example.com/login
Title: Sign in - Example App

<header>
  <a href="/">Example App</a>
</header>
<main>
  <h1>Sign in to your account</h1>
  <form id="login-form" method="post" action="/session">
    <label for="email">Email address</label>
    <input id="email" type="email" value="ada@example.com" required>
    <label for="password">Password</label>
    <input id="password" type="password" value="" required aria-invalid="true">
    <p class="error" role="alert">Password is required.</p>
    <label><input type="checkbox" id="remember" checked> Keep me signed in</label>
    <button type="submit" id="sign-in" disabled>Sign in</button>
    <a href="/forgot">Forgot your password?</a>
  </form>
  <p>New here? <a href="/signup">Create an account</a></p>
</main>
Focused element: input#password"""

DASHBOARD_PAGE = """URL: https://app.example.com/dashboard
Title: Dashboard - Example App

<header>
  <a href="/">Example App</a>
  <nav><a href="/dashboard" aria-current="page">Dashboard</a> <a href="/orders">Orders</a>
       <a href="/settings">Settings</a></nav>
  <button id="account-menu" aria-expanded="false">Ada Lovelace</button>
</header>
<main>
  <h1>Welcome back, Ada</h1>
  <section id="orders">
    <h2>Recent orders</h2>
    <table>
      <tr><th>Order</th><th>Date</th><th>Status</th><th>Total</th></tr>
      <tr><td>#1042</td><td>2026-11-28</td><td>Shipped</td><td>$84.00</td></tr>
      <tr><td>#1039</td><td>2026-11-19</td><td>Delivered</td><td>$12.50</td></tr>
      <tr><td>#1031</td><td>2026-11-02</td><td>Refunded</td><td>$230.00</td></tr>
    </table>
  </section>
  <div class="toast" role="status">Signed in successfully.</div>
</main>
Focused element: body"""

FOCUS = {"type": "choice", "name": "focus", "instructions": "Which element has keyboard focus?",
         "choices": [{"value": "the email field"}, {"value": "the password field"},
                     {"value": "the Sign in button"}]}
BLOCKER = {"type": "choice", "name": "blocker", "instructions": "Why can the user not sign in yet?",
           "choices": [{"value": "The email address is invalid"},
                       {"value": "The password field is empty"},
                       {"value": "The account is locked"}]}
CAN_SUBMIT = {"type": "predicate", "name": "can_submit", "instructions": "Can the form be submitted now?"}
REMEMBER = {"type": "predicate", "name": "remember", "instructions": "Is \"Keep me signed in\" selected?"}
SIGNED_IN = {"type": "predicate", "name": "signed_in", "instructions": "Is the user signed in?"}
NEXT = {"type": "choice", "name": "next", "instructions": "What should the agent do next to check the latest order?",
        "choices": [{"value": "open Orders", "description": "the navigation link"},
                    {"value": "open Settings"}, {"value": "sign out"}]}
PROGRESS = {"type": "score", "name": "progress", "instructions": "How far is the sign-in task?",
            "levels": [{"label": "not started"}, {"label": "in progress"}, {"label": "done"}]}


def call(url, path, body, api_key, method="POST"):
    """One request; returns (status, parsed JSON body, milliseconds)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as res:
            status, text = res.status, res.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    ms = (time.perf_counter() - t0) * 1e3
    try:
        return status, json.loads(text), ms
    except ValueError:
        return status, {"error": {"message": text.decode(errors="replace")}}, ms


def describe(answer):
    """One line for an answer of any type."""
    name = answer.get("name") or "?"
    if answer["type"] == "predicate":
        return f"{name:<11} P(true) = {answer['probability']:.3f}"
    if answer["type"] == "choice":
        probs = ", ".join(f"{json.dumps(p['value'])} {p['probability']:.3f}" for p in answer["probabilities"])
        return f"{name:<11} {json.dumps(answer['choice'])}   ({probs})"
    if answer["type"] == "score":
        probs = ", ".join(f"{p['label']} {p['probability']:.3f}" for p in answer["probabilities"])
        return f"{name:<11} score {answer['score']:.2f} of {len(answer['probabilities']) - 1}   ({probs})"
    return f"{name:<11} {answer['type']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    url = args.url.rstrip("/")

    model = args.model
    if not model:
        status, body, _ = call(url, "/v1/models", None, args.api_key, method="GET")
        if status != 200 or not body.get("data"):
            print(f"agent: GET /v1/models answered {status}: {body}", file=sys.stderr)
            return 1
        model = body["data"][0]["id"]

    history = []
    steps = [
        ("look at the login page", LOGIN_PAGE, [BLOCKER, FOCUS, CAN_SUBMIT]),
        ("one more question about the same page", LOGIN_PAGE, [REMEMBER]),
        ("act: type the password", None, [CAN_SUBMIT, FOCUS, PROGRESS]),
        ("act: press Sign in -> a new page", None, [SIGNED_IN, NEXT, PROGRESS]),
    ]
    page = LOGIN_PAGE
    failed = 0
    print(f"agent: {url}, model {model}")
    for i, (what, new_page, questions) in enumerate(steps, 1):
        if what.startswith("act: type"):
            history.append("typed the password into input#password")
            page = (page.replace('value="" required aria-invalid="true"', 'value="********" required')
                    .replace('    <p class="error" role="alert">Password is required.</p>\n', "")
                    .replace("disabled>Sign in", ">Sign in"))
        elif what.startswith("act: press"):
            history.append("pressed button#sign-in")
            page = DASHBOARD_PAGE
        elif new_page:
            page = new_page
        state = "Actions so far:\n" + ("\n".join(f"{k}. {a}" for k, a in enumerate(history, 1)) or "(none)") + \
                "\n\nCurrent page:\n" + page
        body = {"model": model,
                "input": [{"role": "developer", "content": AGENT}, {"role": "user", "content": state}],
                "questions": questions}
        status, out, ms = call(url, "/v1/decisions", body, args.api_key)
        print(f"\nstep {i}: {what}")
        if status != 200:
            print(f"  HTTP {status}: {out.get('error', out)}")
            failed += 1
            continue
        for a in out["answers"]:
            print("  " + describe(a))
        u = out["usage"]
        cached = u["input_tokens_details"]["cached_tokens"]
        print(f"  {ms:.1f} ms; input tokens {u['input_tokens']} ({len(questions)} row{'s' if len(questions) > 1 else ''}), "
              f"from the state cache {cached}, computed {u['input_tokens'] - cached}, "
              f"newly cached {u['input_tokens_details']['cache_write_tokens']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
