#!/usr/bin/env python3
"""Starts vLLM's real `vllm serve` on CPU with the test worker (see inferscope_vllm/__init__.py).

    .venv-vllm/bin/python3 tests/engine/vllm/serve.py --port P --workdir DIR
        [--kv-blocks N] [--block-size 16] [--max-num-seqs N] [--max-num-batched-tokens N]
        [--max-model-len N] [--truth FILE] [-- extra vllm serve args]

Writes the model directory to DIR/model (once), then replaces itself with
`vllm serve DIR/model ...` (same pid: the API server), so the command line says "vllm serve" as
in production. The EngineCore process it starts writes the scheduler's ground truth to FILE.
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from inferscope_vllm import model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--kv-blocks", type=int, default=0, help="KV pool in blocks (0: vLLM's own sizing)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--truth", type=Path)
    p.add_argument("extra", nargs="*")
    a = p.parse_args()

    a.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = a.workdir / "model"
    if not (model_dir / "tokenizer_config.json").exists():
        model.write(model_dir)
    vllm = shutil.which("vllm", path=str(Path(sys.executable).parent))
    if vllm is None:
        sys.exit(f"no `vllm` next to {sys.executable}: run scripts/setup.sh (.venv-vllm)")

    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # The engine core imports the plugged-in classes from here.
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
        # Sockets under the work dir: one server's IPC never meets another's.
        VLLM_RPC_BASE_PATH=str(a.workdir),
    )
    if a.truth is not None:
        env["INFERSCOPE_VLLM_TRUTH"] = str(a.truth)
    args = [
        vllm, "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(a.port),
        "--served-model-name", "tiny",
        "--distributed-executor-backend", "inferscope_vllm.executor.Executor",
        "--worker-cls", "inferscope_vllm.worker.Worker",
        "--scheduler-cls", "inferscope_vllm.scheduler.GroundTruthScheduler",
        "--block-size", str(a.block_size),
        "--max-num-seqs", str(a.max_num_seqs),
        "--max-model-len", str(a.max_model_len),
        "--enforce-eager",
        "--dtype", "float32",
        "--load-format", "dummy",
    ]
    if a.kv_blocks:
        args += ["--num-gpu-blocks-override", str(a.kv_blocks)]
    if a.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    args += a.extra
    # Through this Python rather than the script's shebang, which names the path the venv was
    # created at (a venv moved or reached through a symlink would not start). The command line
    # is the one the kernel gives a shebang script: python3 .../bin/vllm serve ...
    os.execve(sys.executable, [sys.executable, *args], env)


if __name__ == "__main__":
    main()
