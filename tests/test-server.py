#!/usr/bin/env python3
"""test-server.py OFFLOAD_RUN: `offload-run serve` against the official openai client.

Starts the server on SmolLM2 ($TRI_TEST_MODEL) on a free loopback port (--port 0: it prints the
port it got), with two slots, a queue of one and an API key, and checks with the `openai` package
(and raw HTTP where a client would not send such a request):
  - /v1/models, /health;
  - a chat completion, not streamed and streamed, is the text `offload-run generate --chat` gives
    (greedy), the stream's deltas add up to it, its last chunk ends it and carries the usage;
  - /v1/completions, not streamed and streamed, is the text `offload-run generate` gives;
  - a second turn reuses the slot's cache (cached_tokens) and answers what `offload-run chat`
    answers to the same two lines;
  - two clients at once are both served, on the two slots, at the same time, each with the text it
    gets alone;
  - bad requests get their status and an error in OpenAI's shape, and the server goes on: invalid
    JSON, wrong types, an unknown model, a prompt longer than the context, unsupported fields, no
    key and a wrong key (401), 503 once both slots and the queue are full, and a client that
    disconnects mid-stream (its slot is freed; a good request follows);
  - SIGTERM stops the server with status 0 (under the sanitizers: no leak, no error);
  - --prompt-cache: a second server started with the file the first wrote serves its prompt
    from it (cached_tokens) with the same text; refused at start with --spec or an H2O cache.
Exits 77 (skipped), saying why, without the model, the openai package or a build with the server.
Prints 'N passed, N failed' last.
"""
import http.client
import json
import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SKIP = 77
KEY = "sk-test-key-1234"


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


if len(sys.argv) != 2:
    sys.exit("usage: test-server.py OFFLOAD_RUN")
CLI = sys.argv[1]
MODEL = os.environ.get("TRI_TEST_MODEL", "")
if not MODEL or not os.path.isfile(MODEL):
    skip("TRI_TEST_MODEL is not set (scripts/get-model.sh fetches SmolLM2-135M-Instruct; scripts/test.sh sets it)")
try:
    import openai
except ImportError:
    skip("the openai package is missing (scripts/setup-python.sh installs scripts/requirements-test.txt)")
probe = subprocess.run([CLI, "serve", "--help"], capture_output=True, text=True)
if probe.returncode != 0:
    skip("offload-run was built without the server: " + probe.stderr.strip())

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCALE = float(os.environ.get("TRI_TEST_TIME_SCALE", "1"))  # sanitizer builds are slower
CTX = 512


class Server:
    """The server process: its port, and its stderr lines as they come."""

    def __init__(self, *extra, slots=2):
        self.lines = []
        self.cond = threading.Condition()
        cmd = [CLI, "serve", "-m", MODEL, "--port", "0", *(["--slots", str(slots)] if slots else []), "--queue", "1",
               "--ctx", str(CTX), "--temp", "0", "--api-key", KEY, *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        line = self.wait_line(lambda l: l.startswith("listening on "), 120 * SCALE)
        if line is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))
        self.port = int(line.split("//")[1].split("/")[0].rsplit(":", 1)[1])

    def _read(self):
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred, timeout, start=0):
        end = time.time() + timeout
        with self.cond:
            while True:
                for line in self.lines[start:]:
                    if pred(line):
                        return line
                left = end - time.time()
                if left <= 0 or self.proc.poll() is not None and not any(pred(l) for l in self.lines[start:]):
                    if left > 0:
                        self.cond.wait(0.1)
                        if self.proc.poll() is not None:
                            return None
                    else:
                        return None
                self.cond.wait(min(left, 0.5))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60 * SCALE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def raw(port, method, path, body=None, headers=None, timeout=60):
    """One HTTP request without the openai client: (status, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SCALE)
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


_cli_cache = {}


def cli_text(args):
    """What `offload-run generate` prints, with the server's sampling defaults at temperature 0
    (greedy over the logits that the chat settings' repetition penalty, 1.1, has changed)."""
    key = tuple(args)
    if key not in _cli_cache:
        _cli_cache[key] = _cli_text(args)
    return _cli_cache[key]


def _cli_text(args):
    r = subprocess.run([CLI, "generate", "-m", MODEL, *args], capture_output=True, text=True, timeout=300 * SCALE)
    if r.returncode != 0:
        raise RuntimeError("offload-run generate failed: " + r.stderr)
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout


def extra(obj, name):
    """A field the openai models do not declare (our `triforce` object)."""
    v = getattr(obj, name, None)
    if v is None and getattr(obj, "model_extra", None):
        v = obj.model_extra.get(name)
    return v


passed = failed = 0
# TRI_TEST_ONLY=name,name runs only those checks (for working on one; CI runs them all)
ONLY = set(filter(None, os.environ.get("TRI_TEST_ONLY", "").split(",")))


def check(name, fn):
    global passed, failed
    if ONLY and name not in ONLY:
        return
    t = time.time()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported and counted
        failed += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return
    passed += 1
    print(f"PASS {name} ({time.time() - t:.1f} s)", flush=True)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_error(status, body, want_status, param=None, code=None):
    expect(status == want_status, f"status {status}, want {want_status}: {body}")
    expect(isinstance(body, dict) and isinstance(body.get("error"), dict), f"not an OpenAI error: {body}")
    e = body["error"]
    expect(set(e) == {"message", "type", "param", "code"}, f"error fields {sorted(e)}")
    expect(isinstance(e["message"], str) and e["message"], "no message")
    if param is not None:
        expect(e["param"] == param, f"param {e['param']!r}, want {param!r}")
    if code is not None:
        expect(e["code"] == code, f"code {e['code']!r}, want {code!r}")


def t_usage_errors():
    for args, want in [(["--port", "70000"], "--port '70000'"), (["--slots", "0"], "--slots '0'"),
                       (["--host", "no-such-host.invalid"], "--host 'no-such-host.invalid'"),
                       (["--gamma2", "4"], "--gamma2 applies only to"), (["--spec", "draft"], "--spec draft"),
                       (["--chat-format", "vicuna"], "--chat-format 'vicuna'")]:
        r = subprocess.run([CLI, "serve", "-m", MODEL, *args], capture_output=True, text=True, timeout=60 * SCALE)
        expect(r.returncode == 2 and want in r.stderr, f"{args}: status {r.returncode}, {r.stderr.strip()!r}")
    r = subprocess.run([CLI, "serve", "--port", "0"], capture_output=True, text=True, timeout=60 * SCALE)
    expect(r.returncode == 2 and "-m MODEL is required" in r.stderr, r.stderr)


check("usage_errors", t_usage_errors)
srv = Server()
PORT = srv.port
MODEL_ID = os.path.basename(MODEL)[: -len(".gguf")] if MODEL.endswith(".gguf") else os.path.basename(MODEL)
client = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=KEY, max_retries=0, timeout=120 * SCALE)
print(f"server on port {PORT}, model {MODEL_ID}", flush=True)

Q1 = "What is the capital of France?"
N = 12


def t_models():
    ms = client.models.list()
    ids = [m.id for m in ms.data]
    expect(ids == [MODEL_ID], f"models {ids}")
    st, h = raw(PORT, "GET", "/health", headers={"Authorization": ""})
    expect(st == 200 and h["status"] == "ok" and h["slots"] == 2, f"health {st} {h}")


answer1 = {}


def t_chat():
    want = cli_text(["--chat", "-p", Q1, "-n", str(N), "--temp", "0"])
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": Q1}], max_tokens=N,
                                       temperature=0)
    c = r.choices[0]
    expect(c.message.role == "assistant", f"role {c.message.role}")
    expect(c.message.content == want, f"content {c.message.content!r}, the CLI gives {want!r}")
    expect(c.finish_reason in ("length", "stop"), f"finish_reason {c.finish_reason}")
    expect(r.usage.completion_tokens <= N and r.usage.prompt_tokens > 0, f"usage {r.usage}")
    tf = extra(r, "triforce")
    expect(isinstance(tf, dict) and tf["spec_mode"] == "none" and tf["tokens_per_pass"] == 1.0, f"triforce {tf}")
    answer1["text"] = c.message.content


def t_chat_stream():
    want = cli_text(["--chat", "-p", Q1, "-n", str(N), "--temp", "0"])
    s = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": Q1}], max_tokens=N,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(s)
    expect(len(chunks) >= 3, f"{len(chunks)} chunks")
    expect(chunks[0].choices[0].delta.role == "assistant", "the first chunk has no role")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expect(text == want, f"streamed {text!r}, the CLI gives {want!r}")
    ends = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    expect(len(ends) == 1 and ends[0] is chunks[-2], "one closing chunk, before the usage")
    u = chunks[-1].usage
    expect(chunks[-1].choices == [] and u is not None and 0 < u.completion_tokens <= N, f"usage chunk {chunks[-1]}")
    expect(extra(ends[0], "triforce") is not None, "no triforce figures in the closing chunk")


def t_completions():
    prompt = "The capital of France is"
    want = cli_text(["-p", prompt, "-n", str(N), "--temp", "0", "--repeat-penalty", "1.1"])
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=N, temperature=0)
    expect(r.choices[0].text == want, f"text {r.choices[0].text!r}, the CLI gives {want!r}")
    expect(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == N, f"{r.choices[0]} {r.usage}")
    s = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=N, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in s)
    expect(text == want, f"streamed {text!r}, the CLI gives {want!r}")


def t_second_turn():
    q2 = "And of Germany?"
    cli = subprocess.run([CLI, "chat", "-m", MODEL, "-n", str(N), "--temp", "0"], input=f"{Q1}\n{q2}\n", capture_output=True,
                         text=True, timeout=300 * SCALE)
    expect(cli.returncode == 0, "offload-run chat failed: " + cli.stderr)
    a1, a2 = cli.stdout.split("\n")[:2]
    expect(answer1.get("text") == a1, f"turn 1 {answer1.get('text')!r}, offload-run chat says {a1!r}")
    msgs = [{"role": "user", "content": Q1}, {"role": "assistant", "content": a1}, {"role": "user", "content": q2}]
    # the first turn again, so that a slot holds it (with its answer) whichever ran it before
    r1 = client.chat.completions.create(model=MODEL_ID, messages=msgs[:1], max_tokens=N, temperature=0)
    r = client.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=N, temperature=0)
    tf = extra(r, "triforce")
    expect(tf["cached_tokens"] >= r1.usage.prompt_tokens, f"cached {tf['cached_tokens']} tokens, the first turn's "
           f"prompt was {r1.usage.prompt_tokens}")
    expect(r.usage.prompt_tokens_details.cached_tokens == tf["cached_tokens"], "usage's cached_tokens")
    expect(r.choices[0].message.content == a2, f"turn 2 {r.choices[0].message.content!r}, offload-run chat says {a2!r}")


def t_two_clients():
    prompts = ["Write a poem about the sea.", "Tell me about cats."]
    n = 32
    # ignore_eos: neither answer may end before the other has begun
    alone = [client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": p}], max_tokens=n,
                                            temperature=0, extra_body={"ignore_eos": True}).choices[0].message.content
             for p in prompts]
    start = threading.Barrier(2)
    out = [None, None]
    times = [[None, None], [None, None]]  # first token, last token
    slots = [None, None]

    def run(i):
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=KEY, max_retries=0, timeout=120 * SCALE)
        text = ""
        start.wait(30 * SCALE)
        for ch in c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompts[i]}],
                                            max_tokens=n, temperature=0, stream=True, extra_body={"ignore_eos": True}):
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
                times[i][1] = time.time()
                if times[i][0] is None:
                    times[i][0] = times[i][1]
            if ch.choices and ch.choices[0].finish_reason:
                slots[i] = extra(ch, "triforce")["slot"]
        out[i] = text

    th = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join(300 * SCALE)
    expect(out == alone, f"concurrent {out}, alone {alone}")
    expect(sorted(slots) == [0, 1], f"slots {slots}")
    # at the same time: each got text before the other had its last
    expect(times[0][0] < times[1][1] and times[1][0] < times[0][1], f"not concurrent: {times}")


def t_invalid_json():
    st, b = raw(PORT, "POST", "/v1/chat/completions", body='{"model": "x", "messages": [')
    expect_error(st, b, 400)
    st, b = raw(PORT, "POST", "/v1/chat/completions", body="")
    expect_error(st, b, 400)
    st, b = raw(PORT, "POST", "/v1/completions", body='[1, 2]')
    expect_error(st, b, 400)


def t_wrong_types():
    for body, param in [({"messages": "hi"}, "messages"),
                        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
                        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
                        ({"messages": [{"role": "user", "content": "hi"}], "stop": [1]}, "stop"),
                        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]"),
                        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content")]:
        st, b = raw(PORT, "POST", "/v1/chat/completions", body=body)
        expect_error(st, b, 400, param=param)
    st, b = raw(PORT, "POST", "/v1/completions", body={"prompt": 5})
    expect_error(st, b, 400, param="prompt")
    # through the client too: a BadRequestError carrying the message
    try:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        expect(e.status_code == 400 and "'n'" in str(e), str(e))


def t_garbage():
    """Every prefix of a good body, and random bytes: each a 400 in OpenAI's shape, never a crash."""
    import random
    good = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "max_tokens": 1, "stop": ["x"], "stream_options": {"include_usage": True}})
    rnd = random.Random(5)
    bodies = [good[:i] for i in range(0, len(good), 3)]
    bodies += [bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64))) for _ in range(20)]
    bodies += [good.replace('"hi"', v) for v in ("1e999", "null", "[]", "{}", '"\\ud800"', "-0", "true")]
    for b in bodies:
        st, r = raw(PORT, "POST", "/v1/chat/completions", body=b)
        expect(st == 400 or (st == 200 and b.startswith("{") and b.endswith("}")), f"{b!r}: status {st} {r}")
        if st == 400:
            expect_error(st, r, 400)
    st, h = raw(PORT, "GET", "/health")
    expect(st == 200, "the server is not healthy after garbage")


def t_unknown_model():
    # a request names any model (LangChain sends gpt-3.5-turbo): the one model answers; looking an
    # unknown one up is 404
    r = client.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": Q1}],
                                       max_tokens=N, temperature=0)
    want = cli_text(["--chat", "-p", Q1, "-n", str(N), "--temp", "0"])
    expect(r.choices[0].message.content == want and r.model == MODEL_ID, f"{r.model}: {r.choices[0].message.content!r}")
    try:
        client.models.retrieve("gpt-4o")
        raise AssertionError("an unknown model was found")
    except openai.NotFoundError as e:
        expect(e.status_code == 404 and e.code == "model_not_found", f"{e.status_code} {e.code}")
    st, b = raw(PORT, "GET", "/v1/nothing")
    expect_error(st, b, 404)
    st, b = raw(PORT, "DELETE", "/v1/models")
    expect_error(st, b, 405)


def t_too_long():
    long_text = "the cat sat on the mat " * 200  # about 1,200 tokens, over --ctx 512
    try:
        client.completions.create(model=MODEL_ID, prompt=long_text, max_tokens=4)
        raise AssertionError("a prompt longer than the context was accepted")
    except openai.BadRequestError as e:
        expect(e.code == "context_length_exceeded", f"code {e.code}")
    try:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": long_text}], max_tokens=4,
                                       stream=True)
        raise AssertionError("a streamed prompt longer than the context was accepted")
    except openai.BadRequestError as e:
        expect(e.code == "context_length_exceeded", f"code {e.code}")


def t_api_key():
    for key in (None, "sk-wrong"):
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key=key or "unused", max_retries=0)
        try:
            if key is None:  # no Authorization header at all
                st, b = raw(PORT, "GET", "/v1/models", headers={"Authorization": ""})
                expect_error(st, b, 401, code="invalid_api_key")
                continue
            c.models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError as e:
            expect(e.status_code == 401, str(e))
    st, b = raw(PORT, "POST", "/v1/chat/completions", body={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": "Bearer sk-wrong"})
    expect_error(st, b, 401)


def t_leniency():
    """What clients assume (issue 41, item 6): routes without /v1 and with trailing slashes, HEAD
    /health, a lower-case bearer, integral floats for integers, llama.cpp's fields."""
    hi = {"messages": [{"role": "user", "content": Q1}], "max_tokens": 3, "temperature": 0}
    for path in ("/chat/completions", "/v1/chat/completions/", "/chat/completions//"):
        st, b = raw(PORT, "POST", path, body=hi)
        expect(st == 200 and b["object"] == "chat.completion", f"POST {path}: {st} {b}")
    for path in ("/models", "/v1/models/", "/health/", f"/models/{MODEL_ID}"):
        st, b = raw(PORT, "GET", path)
        expect(st == 200, f"GET {path}: {st} {b}")
    st, b = raw(PORT, "POST", "/completions", body={"prompt": "One, two,", "max_tokens": 2})
    expect(st == 200 and b["object"] == "text_completion", f"/completions: {st} {b}")
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30 * SCALE)
    c.request("HEAD", "/health")
    r = c.getresponse()
    expect(r.status == 200 and r.read() == b"", f"HEAD /health: {r.status}")
    c.close()
    st, b = raw(PORT, "POST", "/v1/chat/completions", body=hi, headers={"Authorization": f"bearer {KEY}"})
    expect(st == 200, f"lower-case bearer: {st} {b}")
    st, b = raw(PORT, "POST", "/v1/chat/completions", body={**hi, "max_tokens": 3.0, "top_k": 40.0, "seed": 7.0})
    expect(st == 200 and b["usage"]["completion_tokens"] <= 3, f"max_tokens 3.0: {st} {b}")
    st, b = raw(PORT, "POST", "/v1/chat/completions", body={**hi, "max_tokens": 3.5})
    expect_error(st, b, 400, param="max_tokens")
    # llama.cpp's fields: neutral values and the ignored ones accepted, the rest refused by name
    st, b = raw(PORT, "POST", "/v1/chat/completions",
                body={**hi, "typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "tfs_z": 1, "grammar": "",
                      "n_keep": 4, "samplers": ["top_k"], "id_slot": -1, "penalize_nl": False, "repeat_last_n": 64})
    expect(st == 200, f"llama.cpp's fields: {st} {b}")
    for field, value in (("typical_p", 0.5), ("mirostat", 2), ("grammar", 'root ::= "yes"'), ("dry_multiplier", 0.8)):
        st, b = raw(PORT, "POST", "/v1/chat/completions", body={**hi, field: value})
        expect_error(st, b, 400, param=field)
    # repeat_last_n 0 turns the penalties off, as in llama.cpp: greedy text without them
    prompt = "One, two, three, four,"
    st, b = raw(PORT, "POST", "/v1/completions",
                body={"prompt": prompt, "max_tokens": N, "temperature": 0, "repeat_last_n": 0})
    want = cli_text(["-p", prompt, "-n", str(N), "--temp", "0", "--repeat-penalty", "1"])
    expect(st == 200 and b["choices"][0]["text"] == want, f"repeat_last_n 0: {b}, without penalties {want!r}")


def t_prefill():
    """A final assistant message is continued (llama-server's prefill, HF's continue_final_message):
    the answer is what the model gives after the conversation rendered by jinja2 from the model's own
    template (the gguf package reads it) and the message's text."""
    try:
        import gguf
        import jinja2.sandbox
    except ImportError as e:
        raise AssertionError(f"the gguf and jinja2 packages are needed: {e}")
    f = gguf.GGUFReader(MODEL).fields["tokenizer.chat_template"]
    tmpl = bytes(f.parts[f.data[0]]).decode()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    start = "The capital of France is the city of"
    text = env.from_string(tmpl).render(messages=[{"role": "user", "content": Q1}], add_generation_prompt=True) + start
    tok = subprocess.run([CLI, "tokenize", "-m", MODEL, "-f", "-", "--ids", "--special", "--no-bos"], input=text,
                         capture_output=True, text=True, timeout=60 * SCALE)
    ids = [int(x) for x in tok.stdout.split()]
    st, b = raw(PORT, "POST", "/v1/completions", body={"prompt": ids, "max_tokens": N, "temperature": 0})
    expect(st == 200, f"{st} {b}")
    r = client.chat.completions.create(model=MODEL_ID, max_tokens=N, temperature=0, messages=[
        {"role": "user", "content": Q1}, {"role": "assistant", "content": start}])
    expect(r.usage.prompt_tokens == len(ids), f"prompt {r.usage.prompt_tokens} tokens, jinja2's {len(ids)}")
    expect(r.choices[0].message.content == b["choices"][0]["text"],
           f"continued {r.choices[0].message.content!r}, after jinja2's rendering {b['choices'][0]['text']!r}")
    st, b = raw(PORT, "POST", "/v1/chat/completions", body={"messages": [{"role": "assistant", "content": "x"}]})
    expect_error(st, b, 400, param="messages")


def t_llama_endpoints():
    """/tokenize and /detokenize (ids against HF tokenizers built from the GGUF, as the smollm2
    suite's reference does), /props, /slots and /metrics (Prometheus text: every sample line parses
    and the counters grow with a request)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
    import gguf
    from smollm2_ref import load_tokenizer
    tok, _ = load_tokenizer(gguf.GGUFReader(MODEL), MODEL)
    text = "Hello, world! 1234 <|im_start|>user\nCafé ☕ naïve"
    st, b = raw(PORT, "POST", "/tokenize", body={"content": text})
    want = tok.encode(text, add_special_tokens=False).ids
    expect(st == 200 and b["tokens"] == want, f"/tokenize {b}, HF tokenizers {want}")
    st, b2 = raw(PORT, "POST", "/v1/tokenize", body={"content": text, "parse_special": False})
    expect(st == 200 and b2["tokens"] != want and 1 not in b2["tokens"], f"parse_special false: {b2}")
    st, p = raw(PORT, "POST", "/tokenize", body={"content": "naïve ☕", "with_pieces": True})
    expect(st == 200 and all(set(e) == {"id", "piece"} for e in p["tokens"]), f"with_pieces {p}")
    joined = b"".join(e["piece"].encode() if isinstance(e["piece"], str) else bytes(e["piece"]) for e in p["tokens"])
    expect(joined.decode() == "naïve ☕", f"pieces {p}")
    st, d = raw(PORT, "POST", "/detokenize", body={"tokens": want})
    expect(st == 200 and d["content"] == tok.decode(want, skip_special_tokens=False) == text, f"/detokenize {d}")
    for path, body, param in (("/tokenize", {"content": 3}, "content"), ("/detokenize", {"tokens": [1e9]}, "tokens[0]"),
                              ("/tokenize", {"content": "x", "bogus": 1}, "bogus")):
        st, e = raw(PORT, "POST", path, body=body)
        expect_error(st, e, 400, param=param)
    st, pr = raw(PORT, "GET", "/props")
    expect(st == 200 and pr["total_slots"] == 2 and pr["default_generation_settings"]["n_ctx"] == CTX and
           pr["default_generation_settings"]["params"]["temperature"] == 0 and pr["model_alias"] == MODEL_ID, f"{pr}")
    st, sl = raw(PORT, "GET", "/slots")
    expect(st == 200 and [x["id"] for x in sl] == [0, 1] and all(x["n_ctx"] == CTX for x in sl), f"/slots {sl}")

    def metrics():
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30 * SCALE)
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        r = c.getresponse()
        body = r.read().decode()
        expect(r.status == 200 and r.getheader("Content-Type").startswith("text/plain"), f"{r.status}")
        vals, types = {}, {}
        for line in body.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                types[name] = kind
            elif line and not line.startswith("#"):
                name, value = line.split(" ")
                expect(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), f"metric name {name!r}")
                vals[name] = float(value)
        expect(set(vals) == set(types) and "llamacpp:prompt_tokens_total" in vals, f"metrics {body}")
        return vals

    m0 = metrics()
    r = client.completions.create(model=MODEL_ID, prompt="Counting: one, two,", max_tokens=4, temperature=0)
    m1 = metrics()
    expect(m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] == r.usage.completion_tokens
           and m1["llamacpp:n_decode_total"] > m0["llamacpp:n_decode_total"] and m1["triforce:requests_total"] ==
           m0["triforce:requests_total"] + 1, f"before {m0}, after {m1}")
    st, e = raw(PORT, "GET", "/metrics", headers={"Authorization": ""})
    expect_error(st, e, 401)


def t_page():
    """GET / is the chat page: HTML with no external assets (no URL to another site, no script or
    style file), whose script node accepts; no key needed for it."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30 * SCALE)
    c.request("GET", "/")
    r = c.getresponse()
    page = r.read().decode()
    c.close()
    expect(r.status == 200 and r.getheader("Content-Type").startswith("text/html"), f"GET / {r.status}")
    for id_ in ("system", "log", "input", "send", "stop", "key"):
        expect(f'id="{id_}"' in page, f"no #{id_}")
    expect(not re.search(r"(src|href)\s*=|@import|url\(|https?://", page), "the page loads something from elsewhere")
    expect("/v1/chat/completions" in page and "stream: true" in page and "triforce" in page, "not the chat page")
    node = shutil.which("node")
    if node:
        script = page.split("<script>", 1)[1].split("</script>", 1)[0]
        r = subprocess.run([node, "--check", "-"], input=script, capture_output=True, text=True, timeout=60)
        expect(r.returncode == 0, f"the page's script does not parse: {r.stderr}")


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
    messages ended by NUL on fds 3 and 4), no package needed."""

    def __init__(self, profile):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()

        def fds():
            os.dup2(r1, 3)
            os.dup2(w2, 4)

        self.proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                                      "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                                     pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self.w, self.r = os.fdopen(w1, "wb", buffering=0), os.fdopen(r2, "rb", buffering=0)
        self.buf, self.id, self.session = b"", 0, None

    def call(self, method, params=None, session=True):
        self.id += 1
        msg = {"id": self.id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = self.r.read(1 << 16)
                if not chunk:
                    raise RuntimeError("chromium went away")
                self.buf += chunk
            m, self.buf = self.buf.split(b"\0", 1)
            m = json.loads(m)
            if m.get("id") == self.id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def open(self, url):
        t = self.call("Target.createTarget", {"url": url}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": t, "flatten": True}, session=False)["sessionId"]

    def eval(self, js):
        r = self.call("Runtime.evaluate", {"expression": js, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{js}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, js, timeout, what):
        end = time.time() + timeout * SCALE
        while time.time() < end:
            if self.eval(js):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self):
        try:
            self.call("Browser.close", session=False)
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - it is going anyway
            self.proc.kill()


def t_browser():
    """The chat page in headless Chromium: a message with a system prompt streams the greedy answer
    offload-run generate --chat gives, with the run's figures; Stop ends a long answer early. The
    screenshot goes to $TRI_TEST_ARTIFACTS (CI keeps it), else the build directory."""
    if not CHROMIUM:
        raise AssertionError("chromium is not installed (scripts/install-deps.sh installs it)")
    system, q = "Answer in one short sentence.", "What is the capital of France?"
    want = cli_text(["--chat", "--system", system, "-p", q, "--temp", "0", "--ctx", str(CTX)])
    b = Browser(os.path.join(os.getcwd(), f"chromium-profile-{os.getpid()}"))
    try:
        b.open(f"http://127.0.0.1:{PORT}/")
        b.wait("typeof send === 'function' && document.readyState === 'complete'", 30, "the page")
        b.eval(f"document.getElementById('key').value = {json.dumps(KEY)};"
               f"document.getElementById('system').value = {json.dumps(system)};"
               f"document.getElementById('input').value = {json.dumps(q)};"
               "document.getElementById('send').click(); true")
        seen = set()
        end = time.time() + 120 * SCALE
        while b.eval("document.body.dataset.state") != "idle" and time.time() < end:
            seen.add(b.eval("document.querySelector('.assistant') ? document.querySelector('.assistant').textContent : ''"))
            time.sleep(0.05)
        text = b.eval("document.querySelector('.assistant').textContent")
        figs = b.eval("document.querySelector('.figures').textContent")
        expect(text == want, f"the page shows {text!r}, offload-run generate --chat gives {want!r}")
        expect(re.search(r"slot \d, prompt \d+ tokens \(\d+ cached\), \d+ generated \(stop\)", figs), f"figures {figs!r}")
        partial = [t for t in seen if t and t != want]
        expect(partial, "no partial text was seen: not streamed")
        shot = b.call("Page.captureScreenshot", {"format": "png"})["data"]
        out = os.environ.get("TRI_TEST_ARTIFACTS", os.getcwd())
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "server-chat-page.png"), "wb") as f:
            f.write(base64.b64decode(shot))
        # Stop: a long answer (a story, no limit) ends at once, marked stopped, and the slot is freed
        b.eval("document.getElementById('input').value = 'Write a long story about a dragon.';"
               "document.body.dataset.state = 'busy'; document.getElementById('send').click(); true")
        b.wait("document.querySelectorAll('.assistant')[1].textContent.length > 20", 60, "the story to begin")
        b.eval("document.getElementById('stop').click(); true")
        b.wait("document.body.dataset.state === 'idle'", 10, "Stop to end the answer")
        expect(b.eval("document.querySelectorAll('.figures')[1].textContent") == "stopped", "not marked stopped")
        wait_until(lambda: raw(PORT, "GET", "/health")[1]["slots_busy"] == 0, 10, "the slot to be freed")
    finally:
        b.close()
        shutil.rmtree(os.path.join(os.getcwd(), f"chromium-profile-{os.getpid()}"), ignore_errors=True)


def t_cors():
    """--cors: a preflight from a listed origin gets the methods and headers, a request its
    Access-Control-Allow-Origin; another origin's preflight is 403 naming it; no --cors, no CORS."""
    a, other = "http://localhost:3000", "http://evil.example"
    c = Server("--slots", "1", "--cors", f"{a},http://127.0.0.1:5173")
    try:
        for port, origin, want in ((c.port, a, 204), (c.port, other, 403), (PORT, a, 403)):
            h = http.client.HTTPConnection("127.0.0.1", port, timeout=30 * SCALE)
            h.request("OPTIONS", "/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type"})
            r = h.getresponse()
            body = r.read().decode()
            expect(r.status == want, f"preflight from {origin}: {r.status} {body}")
            if want == 204:
                expect(r.getheader("Access-Control-Allow-Origin") == origin and
                       "POST" in r.getheader("Access-Control-Allow-Methods") and
                       "authorization" in r.getheader("Access-Control-Allow-Headers").lower(), str(r.getheaders()))
            else:
                expect(origin in json.loads(body)["error"]["message"] and
                       r.getheader("Access-Control-Allow-Origin") is None, body)
            h.close()
        h = http.client.HTTPConnection("127.0.0.1", c.port, timeout=60 * SCALE)
        h.request("POST", "/v1/chat/completions", body=json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                                   "max_tokens": 2}),
                  headers={"Origin": a, "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        r = h.getresponse()
        r.read()
        expect(r.status == 200 and r.getheader("Access-Control-Allow-Origin") == a, str(r.getheaders()))
        h.close()
    finally:
        rc = c.stop()
    expect(rc == 0, f"exit status {rc}")


def open_stream(prompt, n, stream=True):
    """A completion (streamed) sent on a raw socket, nothing read: the socket."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=120 * SCALE)
    body = json.dumps({"prompt": prompt, "max_tokens": n, "stream": stream, "temperature": 0, "ignore_eos": True})
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    return s


def busy():
    st, h = raw(PORT, "GET", "/health")
    return h["slots_busy"], h["queued"]


def wait_until(pred, timeout, what):
    end = time.time() + timeout * SCALE
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def t_disconnect():
    mark = len(srv.lines)
    s = open_stream("Once upon a time", 400)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()  # mid-stream
    line = srv.wait_line(lambda l: "cancelled" in l and "went away" in l, 60 * SCALE, mark)
    expect(line is not None, "the server did not log the cancelled stream")
    expect(" generated " in line and int(line.split(" generated")[0].split(", ")[-1]) < 400,
           f"the stream ran on: {line.strip()}")
    wait_until(lambda: busy() == (0, 0), 30, "the slot to be free")
    # not streamed: the server watches the connection while it generates
    mark = len(srv.lines)
    s = open_stream("Once upon a time", 400, stream=False)
    wait_until(lambda: busy() == (1, 0), 30, "the request to run")
    s.close()
    line = srv.wait_line(lambda l: "cancelled" in l and "went away" in l, 60 * SCALE, mark)
    expect(line is not None, "the server did not log the cancelled request")
    expect(int(line.split(" generated")[0].split(", ")[-1]) < 400, f"the request ran on: {line.strip()}")
    wait_until(lambda: busy() == (0, 0), 30, "the slot to be free")
    r = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=4, temperature=0)
    expect(r.usage.completion_tokens == 4, "the request after the disconnect")


def t_busy_503():
    socks = [open_stream(f"Story number {i}:", 400) for i in range(3)]
    try:
        wait_until(lambda: busy() == (2, 1), 60, "two busy slots and one queued request")
        try:
            client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=2)
            raise AssertionError("a request past the queue was accepted")
        except openai.APIStatusError as e:
            expect(e.status_code == 503, f"status {e.status_code}")
            expect(e.body and e.body.get("code") == "server_busy" if isinstance(e.body, dict) else True, str(e.body))
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: busy() == (0, 0), 60, "the slots and the queue to empty")
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    expect(r.usage.completion_tokens >= 1, "the request after the 503")


def t_seed_and_stop():
    ask = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=8,
               temperature=1.0, seed=1234)
    a = client.chat.completions.create(**ask).choices[0].message.content
    b = client.chat.completions.create(**ask).choices[0].message.content
    expect(a == b, f"the same seed gave {a!r} and {b!r}")
    others = {client.chat.completions.create(**{**ask, "seed": s}).choices[0].message.content for s in (1, 2)}
    expect(len(others | {a}) > 1, "three seeds gave one text: the seed is not used")
    greedy = client.completions.create(model=MODEL_ID, prompt="One, two, three, four,", max_tokens=12, temperature=0)
    full = greedy.choices[0].text
    expect(len(full.strip()) > 2, f"text {full!r}")
    cut = full.strip()[:2]  # a stop string the greedy text holds
    r = client.completions.create(model=MODEL_ID, prompt="One, two, three, four,", max_tokens=12, temperature=0,
                                  stop=[cut])
    expect(r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(cut)],
           f"stop {cut!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), the whole text {full!r}")


def t_interleaved():
    """Two conversations about two documents, their turns interleaved on a server of two slots:
    each keeps its own slot and its cache (issue 41: the template and preamble every prompt shares
    pulled the second conversation onto the first's slot, and each turn re-prefilled its document)."""
    pre = "Read the document below, then answer the question about it in one sentence.\n\n"
    docs = [pre + "The lighthouse keeper of Skerryvore kept a log of every ship that passed the reef, the weather "
            "at dawn and dusk, and the oil the lamp burnt each night. In the winter of 1868 a storm broke the "
            "lantern glass and he kept the light burning with a hand lamp for three nights until the relief boat "
            "could land. The log says the boat brought glass, oil, bread and a letter from his sister in Oban.",
            pre + "Sourdough bread rises because wild yeasts and lactic acid bacteria in the starter ferment the "
            "flour's sugars, making carbon dioxide that the gluten network traps. Bakers feed the starter with "
            "flour and water each day, keep a part of it, and judge its strength by how much it grows in four "
            "hours at room temperature; a weak starter gives a dense loaf with a sour, flat taste."]
    qs = [["What broke in 1868?", "What did the boat bring?"], ["Why does the bread rise?", "How is it fed?"]]
    convs = [[{"role": "user", "content": docs[i] + "\n\nQuestion: " + qs[i][0]}] for i in range(2)]
    slots, cached, prompts = [[], []], [[], []], [[], []]
    for turn in range(2):
        for i in range(2):
            if turn:
                convs[i].append({"role": "user", "content": qs[i][1]})
            r = client.chat.completions.create(model=MODEL_ID, messages=convs[i], max_tokens=8, temperature=0)
            convs[i].append({"role": "assistant", "content": r.choices[0].message.content})
            tf = extra(r, "triforce")
            slots[i].append(tf["slot"])
            cached[i].append(tf["cached_tokens"])
            prompts[i].append(r.usage.prompt_tokens)
    expect(slots[0][0] == slots[0][1] and slots[1][0] == slots[1][1] and slots[0][0] != slots[1][0],
           f"slots of conversation 0: {slots[0]}, of conversation 1: {slots[1]}")
    for i in range(2):
        expect(cached[i][1] >= prompts[i][0], f"conversation {i}: turn 2 took {cached[i][1]} tokens from the cache, "
               f"turn 1's prompt was {prompts[i][0]}")


for name, fn in [("models", t_models), ("chat", t_chat), ("chat_stream", t_chat_stream),
                 ("completions", t_completions), ("second_turn_cached", t_second_turn),
                 ("interleaved_conversations_keep_their_slots", t_interleaved),
                 ("two_clients", t_two_clients), ("invalid_json", t_invalid_json), ("garbage", t_garbage), ("wrong_types", t_wrong_types),
                 ("unknown_model", t_unknown_model), ("too_long_prompt", t_too_long), ("api_key", t_api_key),
                 ("leniency", t_leniency), ("prefill", t_prefill), ("llama_server_endpoints", t_llama_endpoints),
                 ("chat_page", t_page), ("chat_page_in_chromium", t_browser), ("cors", t_cors),
                 ("seed_and_stop", t_seed_and_stop), ("disconnect_mid_stream", t_disconnect),
                 ("busy_503", t_busy_503)]:
    check(name, fn)


def t_stop():
    rc = srv.stop()
    expect(rc == 0, f"the server exited with {rc}:\n" + "".join(srv.lines[-30:]))


check("sigterm", t_stop)
print("---- server log ----")
print("".join(srv.lines), end="")


def spec_server(args, more=None):
    """A speculative server started with args: its greedy chat answer is plain decoding's and its
    triforce object has the figures; then more(client), if given, and a clean stop."""
    spec = Server("--slots", "1", *args)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{spec.port}/v1", api_key=KEY, max_retries=0,
                          timeout=120 * SCALE)
        want = cli_text(["--chat", "-p", Q1, "-n", str(N), "--temp", "0"])
        r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": Q1}], max_tokens=N,
                                      temperature=0)
        expect(r.choices[0].message.content == want, f"{r.choices[0].message.content!r}, plain decoding {want!r}")
        tf = extra(r, "triforce")
        expect(tf["spec_mode"] == "triforce" and tf["full_cache_passes"] >= 1 and tf["tokens_per_pass"] >= 1
               and "l1_acceptance" in tf and "l2_acceptance" in tf, f"triforce {tf}")
        if more:
            more(c)
    finally:
        rc = spec.stop()
        print("".join(spec.lines), end="")
    expect(rc == 0, f"the speculative server exited with {rc}")


def t_spec():
    """A speculative server (prompt-lookup drafts, L2 and L3): greedy answers are plain decoding's,
    the same seed gives the same text twice on one slot, and the triforce object has the figures."""
    def same_seed(c):
        ask = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=99)
        a, b = (c.completions.create(**ask).choices[0].text for _ in range(2))
        expect(a == b, f"the same seed gave {a!r} and {b!r}")

    spec_server(["--spec", "triforce", "--draft-ngram", "3", "--gamma2", "4"], same_seed)


check("speculative", t_spec)


def t_spec_tree():
    """Options the server takes from generate's engine module (cli/cli-engine.c) that its own copy
    lacked (it refused them at start): L3 verifying token trees (--tree-nodes) over f16 drafts
    (--draft-kv-type); greedy answers are still plain decoding's."""
    spec_server(["--spec", "triforce", "--draft-ngram", "3", "--gamma2", "4", "--tree-nodes", "6", "--draft-kv-type",
                 "f16"])


check("speculative_tree", t_spec_tree)

DOC = ("You answer questions about this note. The lighthouse on Gull Island was built in 1871 by the engineer "
       "Mara Ellis. Its lamp burned whale oil until 1902, then kerosene, and it was electrified in 1938. The keeper's "
       "cottage beside it holds a small museum with the original Fresnel lens, a logbook from the storm of 1893 and "
       "a collection of ship models carved by the last keeper, Tomas Varga, who retired in 1967.")


def t_prompt_cache():
    """--prompt-cache: a server writes the file once after its first prefill; a second server
    started with the same file serves the same prompt from it (cached_tokens, no prefill) and a
    prompt sharing the document reuses its prefix, with the texts a fresh server gives; refused at
    start with --spec or a policy the prompt cache does not hold."""
    tmp = os.environ.get("TRI_TEST_TMP") or "/tmp"
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, f"server-pcache-{os.getpid()}.kv")
    if os.path.exists(path):
        os.remove(path)
    for args, want in [(["--spec", "triforce", "--draft-ngram", "3"], "--prompt-cache applies to plain decoding"),
                       (["--kv", "h2o", "--budget", "64"], "cannot load a h2o cache")]:
        r = subprocess.run([CLI, "serve", "-m", MODEL, "--port", "0", "--prompt-cache", path, *args],
                           capture_output=True, text=True, timeout=120 * SCALE)
        expect(r.returncode != 0 and want in r.stderr, f"{args}: status {r.returncode}, {r.stderr.strip()!r}")
    qa, qb = "When was the lamp electrified?", "Who carved the ship models?"
    msgs = lambda q: [{"role": "system", "content": DOC}, {"role": "user", "content": q}]  # noqa: E731

    def ask(c, q):
        r = c.chat.completions.create(model=MODEL_ID, messages=msgs(q), max_tokens=N, temperature=0)
        return r.choices[0].message.content, extra(r, "triforce")["cached_tokens"], r.usage.prompt_tokens

    texts = {}
    a = Server("--prompt-cache", path)
    try:
        expect(a.wait_line(lambda l: "does not exist yet" in l, 5) is not None, "no word of the missing file")
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key=KEY, max_retries=0, timeout=120 * SCALE)
        texts[qa], cached, n_a = ask(c, qa)
        expect(cached == 0, f"a first request on a new server: {cached} cached tokens")
        expect(a.wait_line(lambda l: f"saved {n_a} tokens to {path}" in l, 5) is not None, "the file was not saved")
        texts[qb], _, _ = ask(c, qb)
        expect(sum("saved" in l for l in a.lines) == 1, "the file was written more than once")
    finally:
        rc = a.stop()
    expect(rc == 0, f"the first server exited with {rc}:\n" + "".join(a.lines[-20:]))
    mtime = os.stat(path).st_mtime_ns
    b = Server("--prompt-cache", path)
    try:
        expect(b.wait_line(lambda l: f"holds {n_a} tokens" in l, 5) is not None, "the file was not read at start")
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{b.port}/v1", api_key=KEY, max_retries=0, timeout=120 * SCALE)
        text, cached, n_b = ask(c, qb)  # shares the system prompt with the file
        expect(0 < cached < n_b, f"{cached} of {n_b} prompt tokens cached from the file")
        expect(text == texts[qb], f"{text!r} after a load; the first server said {texts[qb]!r}")
        text, cached, _ = ask(c, qb)  # the slot that loaded holds the whole of it now
        expect(cached == n_b - 1, f"the same prompt again: {cached} of {n_b} tokens cached")
        expect(text == texts[qb], f"{text!r} the second time; the first server said {texts[qb]!r}")
        text, cached, n = ask(c, qa)  # the file's own prompt: nothing to prefill
        expect(cached == n == n_a, f"{cached} of {n} prompt tokens cached, the file holds {n_a}")
        expect(text == texts[qa], f"{text!r} after a load; the first server said {texts[qa]!r}")
    finally:
        rc = b.stop()
        print("".join(b.lines), end="")
    expect(rc == 0, f"the second server exited with {rc}")
    expect(os.stat(path).st_mtime_ns == mtime, "the second server wrote the file again")
    os.remove(path)


check("prompt_cache", t_prompt_cache)

# continuous batching: four slots decoding together in batched passes, prompts prefilled in pieces of
# --batch tokens fused with the other slots' decoding
BATCH_PROMPTS = [("The capital of France is", 20),
                 ("Once upon a time, in a village by the sea, there lived an old fisherman who", 36),
                 (DOC + " Question: who built the lighthouse? Answer:", 12),
                 ("List three colours:", 28)]


def stream_completion(port, prompt, n, times=None):
    """A streamed greedy completion past the end-of-sequence token: (text, triforce figures); times
    gets the arrival of the first and the last piece of text."""
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=300 * SCALE)
    text, tf = "", None
    for ch in c.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=n, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].text:
            text += ch.choices[0].text
            if times is not None:
                times.append(time.time())
        if ch.choices and ch.choices[0].finish_reason:
            tf = extra(ch, "triforce")
    return text, tf


def t_batch():
    """Four concurrent greedy clients (prompts of different lengths, different max_tokens, the
    fourth joining once the first streams) each get the text `offload-run generate` gives for its
    prompt alone, and the passes that ran them carried several sequences."""
    want = [cli_text(["-p", p, "-n", str(n), "--temp", "0", "--repeat-penalty", "1.1", "--ignore-eos"])
            for p, n in BATCH_PROMPTS]
    b = Server("--slots", "4", "--queue", "4", "--batch", "16")
    try:
        out, figs, times = [None] * 4, [None] * 4, [[] for _ in range(4)]

        def run(i):
            out[i], figs[i] = stream_completion(b.port, *BATCH_PROMPTS[i], times=times[i])

        th = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        wait_until(lambda: len(times[0]) > 0, 120, "the first client's first token")
        th.append(threading.Thread(target=run, args=(3,)))
        th[3].start()
        for t in th:
            t.join(300 * SCALE)
        expect(out == want, f"concurrent {out}, offload-run generate {want}")
        expect(all(f and f["batch_passes"] >= n for f, (_, n) in zip(figs, BATCH_PROMPTS)), f"figures {figs}")
        # the joiner decoded beside the others: some of its passes carried several sequences
        expect(times[3][0] < max(times[i][-1] for i in range(3)), f"the fourth client did not join mid-way: {times}")
        expect(figs[3]["batch_mean"] > 1 and max(f["batch_mean"] for f in figs) > 2,
               f"sequences per pass {[f['batch_mean'] for f in figs]}")
    finally:
        rc = b.stop()
    expect(rc == 0, f"the server exited with {rc}:\n" + "".join(b.lines[-20:]))


def t_prefill_split():
    """A short request sent while a long prompt prefills (--batch tokens per pass) gets its
    first token before the long one's prefill ends, with the text it gets alone."""
    long_prompt = " ".join([DOC] * 5) + " In one word, the lamp burned"
    short, n_short = "The capital of France is", 6
    want = cli_text(["-p", short, "-n", str(n_short), "--temp", "0", "--repeat-penalty", "1.1", "--ignore-eos"])
    b = Server("--slots", "2", "--queue", "2", "--ctx", "1024", "--batch", "32")
    try:
        t_long, t_short, res = [], [], {}

        def run_long():
            res["long"] = stream_completion(b.port, long_prompt, 2, times=t_long)

        th = threading.Thread(target=run_long)
        th.start()
        wait_until(lambda: raw(b.port, "GET", "/health")[1]["slots_busy"] == 1, 60, "the long prompt to start")
        text, tf = stream_completion(b.port, short, n_short, times=t_short)
        th.join(300 * SCALE)
        lt = res["long"][1]
        expect(lt["prompt_tokens"] > 500 and lt["batch_passes"] >= lt["prompt_tokens"] // 32,
               f"the long prompt: {lt}")
        expect(t_short and t_long and t_short[0] < t_long[0],
               f"the short request's first token came {t_short[0] - t_long[0]:.2f} s after the long prompt's "
               f"first: it waited for the whole prefill")
        expect(text == want, f"the short request {text!r}, offload-run generate {want!r}")
    finally:
        rc = b.stop()
    expect(rc == 0, f"the server exited with {rc}:\n" + "".join(b.lines[-20:]))


def sse_lines(port, body, on_line, timeout=300):
    """Streams a completion on a raw connection, calling on_line(line) for every line of the SSE
    body (comments included) as it comes; returns every line."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SCALE)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse()
    expect(r.status == 200, f"status {r.status}")
    lines = []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        lines.append(line)
        on_line(line)
    c.close()
    return lines


def t_shutdown():
    """SIGTERM while a stream decodes and another waits: the running stream ends with a closing
    chunk (finish_reason) and [DONE], the queued one with an error event and [DONE], within a bounded
    time; the server exits with 0 (issue 41: streams were cut, logged as the client going away)."""
    b = Server("--slots", "1", "--queue", "2")
    out, got_token, t_sig = [None, None], threading.Event(), {}

    def run(i):
        def on_line(line):
            if i == 0 and line.startswith("data: {") and '"text": ""' not in line:
                got_token.set()
        try:
            out[i] = sse_lines(b.port, {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
                                        "ignore_eos": True, "stream": True}, on_line)
        except Exception as e:  # noqa: BLE001 - reported below
            out[i] = e

    th = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        th[0].start()
        expect(got_token.wait(60 * SCALE), "no token came")
        th[1].start()
        wait_until(lambda: raw(b.port, "GET", "/health")[1]["queued"] == 1, 30, "the second request to queue")
        t_sig["t"] = time.time()
        b.proc.send_signal(signal.SIGTERM)
        for t in th:
            t.join(30 * SCALE)
        took = time.time() - t_sig["t"]
        rc = b.proc.wait(30 * SCALE)
    finally:
        b.stop()
    expect(rc == 0, f"exit status {rc}:\n" + "".join(b.lines[-20:]))
    expect(took < 12 * SCALE, f"the streams ended {took:.1f} s after SIGTERM")
    run0 = [json.loads(l[6:]) for l in out[0] if l.startswith("data: {")]
    expect(out[0][-2:] == ["data: [DONE]", ""] or out[0][-1] == "data: [DONE]", f"the running stream ends {out[0][-3:]}")
    closing = [e for e in run0 if e.get("choices") and e["choices"][0].get("finish_reason")]
    expect(len(closing) == 1 and closing[0]["choices"][0]["finish_reason"] == "stop", f"closing chunk {closing}")
    expect(0 < len(run0) - 1 < 400, f"{len(run0)} events: the answer was not cut")
    expect(isinstance(out[1], list) and "data: [DONE]" in out[1], f"the queued stream: {out[1]}")
    err = [json.loads(l[6:]) for l in out[1] if l.startswith("data: {")]
    expect(err and err[0]["error"]["code"] == "server_busy", f"the queued stream's event: {err}")
    expect(any("the server is stopping" in l for l in b.lines) and
           not any("the client went away" in l for l in b.lines), "".join(b.lines[-10:]))


def t_keep_alive():
    """A stream whose prompt takes a while to prefill gets SSE comments before its first token."""
    long_prompt = " ".join([DOC] * 5) + " In one word, the lamp burned"
    b = Server("--slots", "1", "--ctx", "1024", "--batch", "16", "--keep-alive", "0.2")
    try:
        lines = sse_lines(b.port, {"prompt": long_prompt, "max_tokens": 2, "temperature": 0, "stream": True},
                          lambda l: None)
    finally:
        rc = b.stop()
    first = next(i for i, l in enumerate(lines) if l.startswith("data: "))
    comments = [l for l in lines[:first] if l.startswith(": keep-alive")]
    expect(comments and "prompt" in comments[-1], f"before the first token: {lines[:first]}")
    done = [int(c.split("prompt ")[1].split(" ")[0]) for c in comments if "prompt " in c]
    expect(done == sorted(done) and done[-1] > 0, f"progress {done}")
    expect(lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]", lines[-3:])
    expect(rc == 0, f"exit status {rc}")


def t_bind_first():
    """The port is bound before the model loads: a port in use fails at once, before the model is
    read; a host beyond this machine without an API key is warned about."""
    busy_sock = socket.socket()
    busy_sock.bind(("127.0.0.1", 0))
    busy_sock.listen(1)
    port = busy_sock.getsockname()[1]
    r = subprocess.run([CLI, "serve", "-m", MODEL, "--port", str(port)], capture_output=True, text=True,
                       timeout=60 * SCALE)
    busy_sock.close()
    expect(r.returncode == 1 and "cannot listen" in r.stderr, f"status {r.returncode}: {r.stderr}")
    expect("chat format" not in r.stderr, f"the model was loaded first: {r.stderr}")
    w = subprocess.Popen([CLI, "serve", "-m", MODEL, "--host", "0.0.0.0", "--port", "0", "--slots", "1"],
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "TRI_SERVER_API_KEY": ""})
    err = ""
    try:
        for line in w.stderr:
            err += line
            if line.startswith("listening on"):
                break
        expect("warning: listening on 0.0.0.0" in err and "without an API key" in err, err)
        expect(err.index("warning: listening") < err.index("chat format"), f"warned after the load: {err}")
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(60 * SCALE)


def t_spec_batch():
    """Three concurrent greedy clients of a speculative server (prompt-lookup drafts, L2 and L3)
    each get plain decoding's text for its prompt alone, and the engines' passes were shared."""
    want = [cli_text(["-p", p, "-n", str(n), "--temp", "0", "--repeat-penalty", "1.1", "--ignore-eos", "--device",
                      "cpu"]) for p, n in BATCH_PROMPTS[:3]]
    # on the CPU: engines on a GPU hold their own copies of the weights and share no passes
    b = Server("--slots", "3", "--queue", "3", "--spec", "triforce", "--draft-ngram", "3", "--gamma2", "4",
               "--device", "cpu")
    try:
        out, figs, times = [None] * 3, [None] * 3, [[] for _ in range(3)]

        def run(i):
            out[i], figs[i] = stream_completion(b.port, *BATCH_PROMPTS[i], times=times[i])

        th = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        for t in th:
            t.join(300 * SCALE)
        expect(out == want, f"concurrent {out}, offload-run generate {want}")
        expect(all(f and f["spec_mode"] == "triforce" and f["batch_passes"] >= 1 for f in figs), f"figures {figs}")
        expect(max(f["batch_mean"] for f in figs) > 1.5, f"sequences per pass {[f['batch_mean'] for f in figs]}")
    finally:
        rc = b.stop()
    expect(rc == 0, f"the server exited with {rc}:\n" + "".join(b.lines[-20:]))


def t_default_slots():
    """Without --slots, on the CPU: as many slots as a context's KV cache fits in a quarter of the
    memory available, 1 to 4, the rule printed; with --spec one."""
    d = Server(slots=None)
    try:
        line = d.wait_line(lambda l: l.startswith("slots: "), 10)
        expect(line and "--slots not given" in line and "quarter" in line, f"no rule line: {d.lines}")
        n = int(line.split()[1])
        st, h = raw(d.port, "GET", "/health")
        expect(st == 200 and h["slots"] == n and 1 <= n <= 4, f"health {h}, the rule says {line!r}")
        avail = [int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:")][0]
        per_slot = 2 * 30 * 3 * 64 * 2 * CTX  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16
        if avail // 4 // per_slot >= 4:
            expect(n == 4, f"{n} slots where {avail / 1e9:.1f} GB are available")
    finally:
        rc = d.stop()
    expect(rc == 0, f"the server exited with {rc}")
    sp = Server("--spec", "draft", "--draft-ngram", "3", slots=None)
    try:
        st, h = raw(sp.port, "GET", "/health")
        expect(h["slots"] == 1, f"--spec: {h}")
    finally:
        sp.stop()


check("default_slots", t_default_slots)
check("shutdown_ends_streams", t_shutdown)
check("keep_alive_during_prefill", t_keep_alive)
check("bind_before_load", t_bind_first)
check("batch_four_clients", t_batch)
check("spec_batch_three_clients", t_spec_batch)
check("prefill_split", t_prefill_split)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
