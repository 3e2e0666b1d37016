"""vLLM's real serving stack with only the model's forward pass replaced, for inferscope's tests.

`vllm serve` runs unchanged: its API server, AsyncLLM, the EngineCore process with vLLM's own
Scheduler and KV cache manager, and the ZeroMQ IPC between them. Three classes are plugged in
through vLLM's own command-line switches:

- `executor.Executor` (`--distributed-executor-backend`): vLLM's uniprocess executor (the CPU
  platform would otherwise swap "uni" for "mp").
- `worker.Worker` (`--worker-cls`): declares a KV cache layout for the tiny model and, per
  step, sleeps a realistic time and returns one token id per request that finished its prefill.
- `scheduler.GroundTruthScheduler` (`--scheduler-cls`): vLLM's Scheduler, unchanged, that also
  writes what it did as JSON lines (CLOCK_MONOTONIC) to $INFERSCOPE_VLLM_TRUTH: the ground truth
  the tests compare the agent's records with.

`model.py` writes the model directory (a tiny Llama config and a WordLevel tokenizer, no
weights). `serve.py` is the launcher that puts it all together.
"""
