#!/usr/bin/env python3
"""A small, real, OpenAI-shaped HTTP engine for tests (standard library only).

It stands in for vLLM, SGLang or llama-server wherever a test needs a real
process that listens, loads, serves and dies like an engine:

* ``GET /health`` answers 200 once the server is listening (after
  ``--start-delay``); ``GET /v1/models`` lists the model only after
  ``--load-delay`` more seconds — the agent's Starting → Loading → Ready;
* ``POST /v1/completions`` and ``POST /v1/chat/completions`` answer in the
  OpenAI format (``"stream": true`` as server-sent events), echoing the
  prompt, with the serving port in ``X-Testengine-Port`` and in
  ``system_fingerprint`` so routing tests can tell replicas apart;
* ``--fork-worker`` forks a child that stays in the engine's process group
  (as vLLM's workers do); it must die when the group is stopped. With
  ``--worker-ignores-sigterm`` only SIGKILL ends it;
* ``--record FILE`` writes the argv, selected environment, pid and process
  group as JSON, so tests check what a rendered unit really ran;
* ``--chunk-delay S`` sleeps S seconds after each stream event (a slow stream, to be
  cut mid-way);
* ``--exit-after S --exit-code N`` ends the engine on its own (restart tests);
* ``--stop-delay S`` (or ``TESTENGINE_STOP_DELAY``): on SIGTERM it serves S
  more seconds before it exits, as an engine draining its requests does.

Unknown flags are accepted and recorded, so a test can put this script
where a real engine's binary would be and keep the rendered argv intact.
The model name comes from ``--served-model-name``, ``--alias``, ``--model``
or ``-m``, else the first positional word that is not ``serve``.

Usage: python tests/support/testengine.py serve my-model --port 18000 --load-delay 0.5
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_RECORDED_ENV = (
    "CUDA_*", "NCCL_*", "GLOO_*", "HF_*", "VLLM_*", "SGLANG_*", "LLAMA_*", "LLMGW_*", "OMP_*",
    "TESTENGINE_*", "MASTER_*", "RAY_*",
)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="testengine", allow_abbrev=False)
    parser.add_argument("words", nargs="*")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", "--alias", dest="served_name")
    parser.add_argument("--model", "-m", dest="model")
    parser.add_argument("--start-delay", type=float, default=0.0)
    parser.add_argument("--load-delay", type=float, default=0.0)
    parser.add_argument("--response-delay", type=float, default=0.0)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--fork-worker", action="store_true")
    parser.add_argument("--worker-pid-file")
    parser.add_argument("--worker-ignores-sigterm", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--stop-delay", type=float,
                        default=float(os.environ.get("TESTENGINE_STOP_DELAY", "0")))
    parser.add_argument("--record")
    parser.add_argument("--record-env", action="append", default=[])
    parser.add_argument("--say-env", action="append", default=[],
                        help="print NAME=value of this variable at start (a leaky engine)")
    parser.add_argument("--exit-after", type=float)
    parser.add_argument("--exit-code", type=int, default=1)
    return parser.parse_known_args(argv)


def model_name(args: argparse.Namespace) -> str:
    if args.served_name:
        return str(args.served_name)
    if args.model:
        return str(args.model)
    words = [w for w in args.words if w != "serve"]
    return words[0] if words else "testengine"


def log(message: str) -> None:
    print(f"testengine[{os.getpid()}]: {message}", flush=True)


def fork_worker(pid_file: str | None, ignore_sigterm: bool) -> int:
    """A child in the same process group, like an engine's worker processes."""
    child = os.fork()
    if child == 0:
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            while True:
                time.sleep(3600)
        finally:
            os._exit(0)
    if pid_file:
        with open(pid_file, "w") as handle:
            handle.write(f"{child}\n")
    log(f"forked worker pid {child}")
    return child


def record(path: str, argv: list[str], patterns: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
    data = {"argv": argv, "env": env, "pid": os.getpid(), "pgid": os.getpgid(0), "cwd": os.getcwd()}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


class Engine:
    def __init__(self, model: str, port: int, load_delay: float, response_delay: float) -> None:
        self.model = model
        self.port = port
        self.loaded_at = time.monotonic() + load_delay
        self.response_delay = response_delay
        self.chunk_delay = 0.0
        self.created = int(time.time())
        self.flavour = "llama.cpp"  # whose /metrics families it serves: llama.cpp or vllm
        self.lock = threading.Lock()
        self.in_flight = 0
        self.tokens = 0  # completion tokens produced, as the engine's counter counts them
        self.started = time.monotonic()

    def metrics(self) -> str:
        """``/metrics`` in the families the real engine serves (as recorded in
        tests/fixtures/engines/): the requests in flight, none waiting, tokens so far."""
        with self.lock:
            running, tokens = self.in_flight, self.tokens
        rate = tokens / max(time.monotonic() - self.started, 1e-3)
        if self.flavour == "vllm":
            labels = f'{{engine="0",model_name="{self.model}"}}'
            return (f"# TYPE vllm:num_requests_running gauge\n"
                    f"vllm:num_requests_running{labels} {float(running)}\n"
                    f"# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{labels} 0.0\n"
                    f"# TYPE vllm:kv_cache_usage_perc gauge\n"
                    f"vllm:kv_cache_usage_perc{labels} {min(running * 0.01, 1.0)}\n"
                    f"# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total{labels} {float(tokens)}\n")
        return ("# HELP llamacpp:tokens_predicted_total Number of generation tokens processed\n"
                "# TYPE llamacpp:tokens_predicted_total counter\n"
                f"llamacpp:tokens_predicted_total {tokens}\n"
                "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in "
                "tokens/s\n# TYPE llamacpp:predicted_tokens_seconds gauge\n"
                f"llamacpp:predicted_tokens_seconds {rate:g}\n"
                "# HELP llamacpp:requests_processing Number of requests processing\n"
                "# TYPE llamacpp:requests_processing gauge\n"
                f"llamacpp:requests_processing {running}\n"
                "# HELP llamacpp:requests_deferred Number of requests deferred\n"
                "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")

    @property
    def loaded(self) -> bool:
        return time.monotonic() >= self.loaded_at


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:
        if self.command == "GET":
            return  # readiness probes every few seconds would bury everything else
        log(f"{self.command} {self.path} " + (format % args).split('"')[-1].strip())

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Testengine-Port", str(self.engine.port))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/metrics":
            data = self.engine.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            data = []
            if self.engine.loaded:
                data.append({"id": self.engine.model, "object": "model",
                             "created": self.engine.created, "owned_by": "testengine"})
            self._json(200, {"object": "list", "data": data})
        else:
            self._error(404, f"no route {self.path}", "not_found_error")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "body is not JSON", "invalid_request_error")
            return
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route {self.path}", "not_found_error")
            return
        if not self.engine.loaded:
            self._error(503, "model is loading", "service_unavailable")
            return
        if body.get("model") not in (None, self.engine.model):
            self._error(404, f"model {body.get('model')!r} does not exist", "not_found_error")
            return
        if self.engine.response_delay:
            time.sleep(self.engine.response_delay)
        if chat:
            messages = body.get("messages") or [{}]
            prompt = str(messages[-1].get("content", ""))
        else:
            prompt = str(body.get("prompt", ""))
        text = f"echo: {prompt}"
        with self.engine.lock:
            self.engine.in_flight += 1
        try:
            if body.get("stream"):
                self._stream(chat, text)
            else:
                self._json(200, self._completion(chat, text, len(prompt.split())))
        finally:
            with self.engine.lock:
                self.engine.in_flight -= 1
                self.engine.tokens += len(text.split())

    def _base(self, chat: bool, suffix: str = "") -> dict[str, Any]:
        kind = "chat.completion" if chat else "text_completion"
        return {"id": f"cmpl-{os.getpid()}-{time.monotonic_ns()}", "object": kind + suffix,
                "created": int(time.time()), "model": self.engine.model,
                "system_fingerprint": f"testengine-{self.engine.port}"}

    def _completion(self, chat: bool, text: str, prompt_tokens: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        completion_tokens = len(text.split())
        return self._base(chat) | {"choices": [choice], "usage": {
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}}

    def _stream(self, chat: bool, text: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Testengine-Port", str(self.engine.port))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        pieces = text.split(" ")
        for i, piece in enumerate(pieces):
            token = piece if i == 0 else " " + piece
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": token} | ({"role": "assistant"} if i == 0 else {})
            else:
                choice["text"] = token
            chunk = self._base(chat, ".chunk" if chat else "") | {"choices": [choice]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            if self.engine.chunk_delay:
                time.sleep(self.engine.chunk_delay)
        final: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        final |= {"delta": {}} if chat else {"text": ""}
        last = self._base(chat, ".chunk" if chat else "") | {"choices": [final]}
        self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


def drain(seconds: float) -> None:
    """SIGTERM with ``--stop-delay``: keep serving for ``seconds``, then exit (as an
    engine finishing the requests in flight does)."""
    log(f"SIGTERM: draining for {seconds}s")

    def leave() -> None:
        time.sleep(seconds)
        os._exit(0)
    threading.Thread(target=leave, daemon=True).start()


def main(argv: list[str]) -> int:
    args, unknown = parse(argv)
    patterns = list(DEFAULT_RECORDED_ENV) + list(args.record_env)
    model = model_name(args)
    log(f"argv {json.dumps(argv)}")
    for name in args.say_env:
        log(f"env {name}={os.environ.get(name, '')}")
    if args.fork_worker:
        fork_worker(args.worker_pid_file, args.worker_ignores_sigterm)
    if args.record:
        record(args.record, [sys.argv[0], *argv], patterns)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.stop_delay:
        signal.signal(signal.SIGTERM, lambda signum, frame: drain(args.stop_delay))
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    if args.exit_after is not None:
        def leave() -> None:
            time.sleep(args.exit_after)
            log(f"exiting with status {args.exit_code} as asked")
            os._exit(args.exit_code)
        threading.Thread(target=leave, daemon=True).start()
    if args.start_delay:
        log(f"starting; listening in {args.start_delay}s")
        time.sleep(args.start_delay)
    Handler.engine = Engine(model, args.port, args.load_delay, args.response_delay)
    Handler.engine.chunk_delay = args.chunk_delay
    Handler.engine.flavour = "vllm" if "serve" in args.words else "llama.cpp"
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    log(f"listening on http://{args.host}:{args.port}; loading {model} for {args.load_delay}s")
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        server.server_close()
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
