"""vLLM's uniprocess executor under a class path of our own.

The CPU platform rewrites `--distributed-executor-backend uni` to "mp" (a worker process per
rank); a class path is taken as is, so the worker runs inside the EngineCore process, as on a
single-GPU deployment.
"""
from vllm.v1.executor.uniproc_executor import UniProcExecutor


class Executor(UniProcExecutor):
    pass
