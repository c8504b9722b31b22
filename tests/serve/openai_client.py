#!/usr/bin/env python3
"""An OpenAI-style client with the standard library only (urllib, http.client), checking the wire format of
`microllm serve`: /v1/models, completions and chat completions with stream false and true (server-sent
events ending with [DONE], usage), and OpenAI error objects for bad requests. Exit code 0 when every check
passes. Usage: openai_client.py http://127.0.0.1:PORT"""
import http.client
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

BASE = sys.argv[1].rstrip("/")
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def post(path, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def stream(path, body):
    """POSTs with http.client and reads the event stream line by line, as the openai package does."""
    url = urllib.parse.urlparse(BASE)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    check(response.status == 200, f"{path} stream: status {response.status}")
    check(response.getheader("Content-Type", "").startswith("text/event-stream"), f"{path} stream: text/event-stream")
    chunks, done, stray = [], False, []
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data: ") or done:
            stray.append(line)
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        chunks.append(json.loads(data))
    conn.close()
    check(not stray, f"{path} stream: only data lines, none after [DONE] {stray[:2]}")
    check(done, f"{path} stream: {len(chunks)} chunks, then [DONE]")
    return chunks


# /v1/models
with urllib.request.urlopen(BASE + "/v1/models", timeout=30) as r:
    models = json.load(r)
check(models["object"] == "list" and models["data"][0]["id"] == "tiny", "/v1/models lists the model")

# Completions: stream false, then true with the same greedy request: the same text and usage.
request = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
status, ctype, text = post("/v1/completions", request)
check(status == 200 and ctype.startswith("application/json"), f"/v1/completions: status {status}")
c = json.loads(text)
check(c["object"] == "text_completion" and isinstance(c["choices"][0]["text"], str), "completion object")
check(c["choices"][0]["finish_reason"] in ("stop", "length"), "completion finish_reason")
u = c["usage"]
check(u["prompt_tokens"] == 16 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage {u}")
chunks = stream("/v1/completions", dict(request, stream_options={"include_usage": True}))
usage_chunk = chunks.pop()  # stream_options.include_usage: the last chunk has the usage and no choices
check(usage_chunk["choices"] == [] and usage_chunk["usage"] == u, f"streamed usage {usage_chunk}")
check(all(ch["object"] == "text_completion" for ch in chunks), "completion chunks are text_completion")
check("".join(ch["choices"][0]["text"] for ch in chunks) == c["choices"][0]["text"], "streamed text == whole text")
check(chunks[-1]["choices"][0]["finish_reason"] == c["choices"][0]["finish_reason"], "streamed finish_reason")
check(all(ch["usage"] is None for ch in chunks), "the other chunks have usage null")

# Chat completions.
chat = {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
        "max_tokens": 10, "temperature": 0}
status, _, text = post("/v1/chat/completions", chat)
check(status == 200, f"/v1/chat/completions: status {status}")
cc = json.loads(text)
check(cc["object"] == "chat.completion" and cc["choices"][0]["message"]["role"] == "assistant", "chat.completion object")
chunks = stream("/v1/chat/completions", chat)
check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "the first chunk carries the role")
content = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
check(content == cc["choices"][0]["message"]["content"], "streamed chat content == whole content")
check(chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), "chat stream finish_reason")

# Sampling with a seed: the same seed, the same text.
seeded = {"prompt": "seeded", "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 1234}
a = json.loads(post("/v1/completions", seeded)[2])["choices"][0]["text"]
b = json.loads(post("/v1/completions", seeded)[2])["choices"][0]["text"]
check(a == b, "the same seed gives the same text")

# Errors: OpenAI error objects.
for name, path, body, raw, want, param in [
    ("malformed JSON", "/v1/completions", None, b'{"prompt": ', 400, None),
    ("max_tokens of the wrong type", "/v1/completions", {"prompt": "x", "max_tokens": "ten"}, None, 400, "max_tokens"),
    ("messages missing", "/v1/chat/completions", {"model": "tiny"}, None, 400, "messages"),
    ("an unknown field", "/v1/completions", {"prompt": "x", "temprature": 0}, None, 400, "temprature"),
    ("tools (not supported)", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
     None, 400, "tools"),
    ("a prompt longer than the context", "/v1/completions", {"prompt": "a" * 600}, None, 400, "prompt"),
    ("an oversized body", "/v1/completions", None, b" " * 100000, 413, None),
]:
    status, ctype, text = post(path, body, raw)
    error = json.loads(text).get("error", {}) if ctype.startswith("application/json") else {}
    ok = status == want and isinstance(error.get("message"), str) and "type" in error and "code" in error
    if param:
        ok = ok and error.get("param") == param
    check(ok, f"{name}: {status} {text[:160]}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
