#!/usr/bin/env python3
"""bench-serve.py: aggregate throughput of `offload-run serve` with N concurrent greedy clients
against the same N requests served one after another, a ratio measured in one run.

    benchmarks/bench-serve.py build/cli/offload-run [-m MODEL] [--clients 4] [--tokens 64]
                              [--server-args "--spec triforce --draft-ngram 3"]

One server (--slots N, greedy, --ctx 4096) answers N completions with prompts of different lengths,
each generating --tokens tokens past the end-of-sequence token (ignore_eos), first one at a time
(each request sent when the previous has its answer), then all at once, in --rounds rounds that
alternate the order (a machine whose load drifts weighs on both ways alike). The texts must be the
same both ways (checked first: greedy output of a batched pass is the output alone); then it prints
the wall times, the generated tokens per second of each way and their ratio, the server's CPU time
each way (on a machine shared with other work, a server with more busy threads gets more of the
CPUs: the ratio of CPU time is the figure that load does not bend), and the time to first token
of a short request sent alone and sent while a long prompt prefills. Needs only the Python standard
library. The machine it ran on goes with any figure quoted (docs/benchmarks.md).
"""
import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a village by the sea, there lived an old fisherman who",
    "Write a short story about a robot who learns to paint. The robot lives in a small apartment in a big city "
    "and has never seen a painting before. One day it finds a brush on the street.",
    "List the planets of the solar system in order from the sun, and say one thing about each of them: its size, "
    "its colour, how many moons it has or how long its day is. Then say which one you would visit first and why, "
    "in a few sentences, as if you were writing to a friend who has never looked at the night sky.",
    "Explain how a bicycle stays upright.",
    "The three most important inventions of the nineteenth century were",
    "Dear diary, today I",
    "In the beginning of the project, the team decided to write everything in C because",
]


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


def cpu_seconds(pid):
    """User + system CPU time of process pid so far (/proc/PID/stat), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request(port, prompt, n, stream=False, first=None):
    """A greedy completion: (text, usage); first gets the time of the first streamed event (the
    first piece of text, or the closing chunk of an answer with none)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"bench-serve: the server answered {r.status}: {r.read().decode()}")
    if not stream:
        out = json.loads(r.read())
        c.close()
        return out["choices"][0]["text"], out["usage"]
    text = ""
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if first is not None and not first:  # the first event: text, or the end when there is none
            first.append(time.time())
        if ev.get("choices") and ev["choices"][0].get("text"):
            text += ev["choices"][0]["text"]
    c.close()
    return text, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cli", help="the offload-run binary")
    ap.add_argument("-m", "--model", default=os.environ.get("TRI_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients and slots (default 4)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each request generates (default 64)")
    ap.add_argument("--batch", type=int, default=0, help="the server's --batch (default: its own)")
    ap.add_argument("--threads", type=int, default=0, help="the server's -t (default: its own)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both ways, alternating (default 3)")
    ap.add_argument("--device", default="", help="the server's --device (default: its own)")
    ap.add_argument("--server-args", default="", help="more options for the server, e.g. \"--spec triforce "
                    "--draft-ngram 3\" (its slots' engines then generate together)")
    a = ap.parse_args()
    n = a.clients
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    cmd = [a.cli, "serve", "-m", a.model, "--port", "0", "--slots", str(n), "--queue", str(n), "--ctx", "4096",
           "--temp", "0"]
    if a.batch:
        cmd += ["--batch", str(a.batch)]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if a.device:
        cmd += ["--device", a.device]
    cmd += a.server_args.split()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port, device = None, "?"
    for line in proc.stderr:
        if line.startswith("device: "):
            device = line[8:].strip()
        if line.startswith("listening on "):
            port = int(line.split("//")[1].split("/")[0].rsplit(":", 1)[1])
            break
    if port is None:
        sys.exit("bench-serve: the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # drain its log
    try:
        request(port, prompts[0], 8)  # warm: pages of the weights, the thread pool

        together = [None] * n

        def run(i):
            together[i] = request(port, prompts[i], a.tokens)

        def one_by_one():
            t, c = time.time(), cpu_seconds(proc.pid)
            out = [request(port, p, a.tokens) for p in prompts]
            cpu_seq.append(cpu_seconds(proc.pid) - c)
            return time.time() - t, out

        def all_at_once():
            th = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            t, c = time.time(), cpu_seconds(proc.pid)
            for x in th:
                x.start()
            for x in th:
                x.join()
            cpu_con.append(cpu_seconds(proc.pid) - c)
            return time.time() - t

        # rounds in the order seq, con, con, seq, seq, con, ...: a load that drifts during the run
        # weighs on both ways alike
        t_seq, t_con, cpu_seq, cpu_con, alone = [], [], [], [], None
        for r in range(a.rounds):
            for way in ((0, 1) if r % 2 == 0 else (1, 0)):
                if way == 0:
                    dt, alone = one_by_one()
                    t_seq.append(dt)
                else:
                    t_con.append(all_at_once())
                    bad = [i for i in range(n) if together[i][0] != alone[i][0]] if alone else []
                    if bad:
                        sys.exit(f"bench-serve: FAILED: requests {bad} gave other texts concurrently than alone")
        bad = [i for i in range(n) if together[i][0] != alone[i][0]]
        if bad:
            sys.exit(f"bench-serve: FAILED: requests {bad} gave other texts concurrently than alone")
        gen = sum(u["completion_tokens"] for _, u in alone)
        ptok = [u["prompt_tokens"] for _, u in alone]
        print(f"machine: {machine()}; server: {device}")
        print(f"model: {a.model}; {n} clients, prompts of {ptok} tokens, {a.tokens} tokens each (greedy, "
              f"ignore_eos)")
        print(f"texts: the same concurrently as one at a time ({n} of {n})")
        fmt = lambda ts: ", ".join(f"{x:.2f}" for x in ts)  # noqa: E731
        print(f"one after another: {sum(t_seq):7.2f} s in all ({fmt(t_seq)}), "
              f"{gen * len(t_seq) / sum(t_seq):7.1f} generated tokens/s")
        print(f"{n} concurrent:      {sum(t_con):7.2f} s in all ({fmt(t_con)}), "
              f"{gen * len(t_con) / sum(t_con):7.1f} generated tokens/s")
        print(f"server CPU time: {sum(cpu_seq):.2f} s one after another, {sum(cpu_con):.2f} s concurrent: "
              f"{sum(cpu_seq) / sum(cpu_con):.2f}x the tokens per CPU second (load-independent: more threads do "
              f"not win a larger share of a busy machine)")
        ratios = sorted(x / y for x, y in zip(t_seq, t_con))
        print(f"ratio: {sum(t_seq) / sum(t_con):.2f}x aggregate throughput over {a.rounds} rounds (per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; median {ratios[len(ratios) // 2]:.2f}x)", flush=True)

        # time to first token of a short request: alone, then while a long prompt prefills
        long_prompt = " ".join(PROMPTS) * 2
        first = []
        t = time.time()
        request(port, PROMPTS[0], 2, stream=True, first=first)
        ttft_alone = first[0] - t
        long_first = []
        t_long = time.time()
        lt = threading.Thread(target=request, args=(port, long_prompt, 2, True, long_first))
        lt.start()
        time.sleep(0.05)
        first = []
        t = time.time()
        request(port, PROMPTS[0], 2, stream=True, first=first)
        ttft_busy = first[0] - t
        lt.join()
        n_long = request(port, long_prompt, 1)[1]["prompt_tokens"]
        print(f"time to first token of a short request: {ttft_alone:.3f} s alone, {ttft_busy:.3f} s while a long "
              f"prompt of {n_long} tokens prefills (whose own first token came after {long_first[0] - t_long:.3f} s)")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
