"""A vLLM worker whose forward pass only sleeps.

Everything around it is vLLM's: the scheduler decides which requests run and how many tokens
each computes, the KV cache manager allocates (and runs out of) blocks. Per step the worker
sleeps `INFERSCOPE_VLLM_STEP_MS` (default 4 ms) plus `INFERSCOPE_VLLM_TOKEN_US` (default 20 µs)
per scheduled token, like a small model on a GPU, and samples one token for each request whose
prompt (and any output it must recompute after a preemption) is fully computed after the step.

With `INFERSCOPE_VLLM_MOCK_CUDA` naming the mock CUDA driver (tests/mock-cuda: libcuda.so), the
worker calls its cuInit (which loads the injection library named by CUDA_INJECTION64_PATH, the
CUPTI shim) and, in every step, launches `EAGER_KERNELS` kernels through cuLaunchKernel and one
CUDA graph of `GRAPH_NODES` kernels through cuGraphLaunch (as vLLM's piecewise graphs run eager
attention beside captured pieces): the shim sees `KERNELS_PER_STEP` kernel records a step, as it
would on a GPU, and the launch uprobes three launches.
"""
import ctypes
import os
import time
from types import SimpleNamespace

import torch

from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

STEP_S = float(os.environ.get("INFERSCOPE_VLLM_STEP_MS", "4")) / 1e3
TOKEN_S = float(os.environ.get("INFERSCOPE_VLLM_TOKEN_US", "20")) / 1e6
# Sampled ids stay clear of the special tokens at the start of the vocabulary.
FIRST_WORD = 16
EAGER_KERNELS = (b"attention_fwd", b"gemm_bf16")
GRAPH_NODES = (b"rms_norm_kernel", b"gemm_bf16", b"gemm_bf16")
KERNELS_PER_STEP = len(EAGER_KERNELS) + len(GRAPH_NODES)


class Worker(WorkerBase):
    def init_device(self) -> None:
        self.device = torch.device("cpu")
        # req id -> tokens the request holds (prompt + sampled outputs)
        self.lengths: dict[str, int] = {}
        self.kv_cache_config = None
        # Disaggregated serving (connector.py): engine id -> (load started, modelled transfer
        # time), in load order.
        self.kv_loads: dict[str, tuple[float, float]] = {}
        self.kv_truth = None
        truth = os.environ.get("INFERSCOPE_VLLM_TRUTH")
        if truth:
            self.kv_truth = open(truth, "a", buffering=1)
        self.cuda = None
        path = os.environ.get("INFERSCOPE_VLLM_MOCK_CUDA")
        if path:
            self.cuda = ctypes.CDLL(path)
            self.cuda.cuLaunchKernel.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 7 + [
                ctypes.c_size_t,
                ctypes.c_void_p,
                ctypes.c_void_p,
            ]
            if self.cuda.cuInit(0) != 0:
                raise RuntimeError(f"cuInit of {path} failed")
            # The mock driver's graph: its node names must outlive it (kept on self).
            self.graph_nodes = (ctypes.c_char_p * len(GRAPH_NODES))(*GRAPH_NODES)
            self.cuda.mockGraphInstantiate.restype = ctypes.c_void_p
            self.cuda.mockGraphInstantiate.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
            self.cuda.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            self.graph = self.cuda.mockGraphInstantiate(self.graph_nodes, len(GRAPH_NODES))

    def load_model(self, *args, **kwargs) -> None:
        pass

    def _spec(self) -> FullAttentionSpec:
        hf = self.model_config.hf_config
        heads = getattr(hf, "num_key_value_heads", hf.num_attention_heads)
        return FullAttentionSpec(
            block_size=self.cache_config.block_size,
            num_kv_heads=heads,
            head_size=hf.hidden_size // hf.num_attention_heads,
            dtype=torch.float32,
        )

    def get_kv_cache_spec(self):
        layers = self.model_config.hf_config.num_hidden_layers
        return {f"model.layers.{i}.self_attn.attn": self._spec() for i in range(layers)}

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]

    def determine_available_memory(self) -> int:
        # Room for 64k tokens; --num-gpu-blocks-override sets the pool the tests use.
        layers = self.model_config.hf_config.num_hidden_layers
        return self._spec().page_size_bytes * layers * (65536 // self.cache_config.block_size)

    def initialize_from_config(self, kv_cache_config) -> None:
        self.kv_cache_config = kv_cache_config

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        pass

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(0.0, 0.0)

    def get_cache_block_size_bytes(self) -> int:
        return self._spec().page_size_bytes

    def check_health(self) -> None:
        return

    def get_supported_tasks(self):
        return ("generate",)

    def supports_draft_weight_updates(self) -> bool:
        return False

    def reset_mm_cache(self) -> None:
        pass

    def reset_encoder_cache(self) -> None:
        pass

    def get_kv_connector_handshake_metadata(self):
        return None

    def get_simple_cpu_offload_num_cpu_blocks(self):
        return None

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def execute_dummy_batch(self) -> None:
        pass

    def list_loras(self) -> set:
        return set()

    def _kv_connector_output(self, so):
        """The connector's worker side: a load the scheduler started this step finishes after
        the modelled transfer delay (the connector's delay plus a per-request jitter of 0-8 ms,
        so that a transfer time given to the wrong request shows); reported with the first
        step after that, with NIXL's own stats (vLLM's NixlKVConnectorStats: one
        `transfer_duration` per finished transfer, the transfer's own time, in the order the
        loads started), which vLLM's scheduler sends over its IPC and its API server turns
        into `vllm:nixl_xfer_time_seconds`."""
        meta = getattr(so, "kv_connector_metadata", None)
        if meta is None and not self.kv_loads:
            return None
        from inferscope_vllm.connector import transfer_delay_s, transfer_jitter_s

        now = time.monotonic()
        for rid in getattr(meta, "loads", None) or ():
            delay = transfer_delay_s() + transfer_jitter_s(rid)
            self.kv_loads[rid] = (now, delay)
            if self.kv_truth is not None:
                self.kv_truth.write(f'{{"ev":"kv_load","id":"{rid}","t":{now},"model":{delay}}}\n')
        # In load order, as NIXL polls its transfers.
        done = [rid for rid, (start, delay) in self.kv_loads.items() if start + delay <= now]
        stats = None
        if done:
            from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
                NixlKVConnectorStats,
            )

            stats = NixlKVConnectorStats()
        for rid in done:
            start, delay = self.kv_loads.pop(rid)
            # What nixlXferTelemetry gives (microseconds): the transfer took the modelled
            # delay; posting it is immediate; the fake transfer moves no bytes.
            stats.record_transfer(
                SimpleNamespace(xferDuration=delay * 1e6, postDuration=0.0, totalBytes=0, descCount=1)
            )
            if self.kv_truth is not None:
                self.kv_truth.write(
                    f'{{"ev":"kv_received","id":"{rid}","t":{now},"xfer":{delay}}}\n'
                )
        return KVConnectorOutput(finished_recving=set(done) or None, kv_connector_stats=stats)

    def execute_model(self, scheduler_output) -> ModelRunnerOutput:
        so = scheduler_output
        kv_output = self._kv_connector_output(so)
        for rid in so.finished_req_ids:
            self.lengths.pop(rid, None)
        for new in so.scheduled_new_reqs:
            self.lengths[new.req_id] = new.prompt_len
        cached = so.scheduled_cached_reqs
        computed = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            if rid in cached.resumed_req_ids and rid in cached.all_token_ids:
                self.lengths[rid] = len(cached.all_token_ids[rid])
        req_ids = list(so.num_scheduled_tokens.keys())
        sampled: list[list[int]] = []
        for rid in req_ids:
            done = computed.get(rid, 0) + so.num_scheduled_tokens[rid]
            length = self.lengths.get(rid, 0)
            if done >= length:
                token = FIRST_WORD + (length * 7919) % (self.model_config.get_vocab_size() - FIRST_WORD)
                sampled.append([token])
                self.lengths[rid] = length + 1
            else:
                sampled.append([])  # a chunk of a prefill: nothing sampled yet
        if req_ids:
            if self.cuda is not None:
                for name in EAGER_KERNELS:
                    self.cuda.cuLaunchKernel(name, 64, 1, 1, 128, 1, 1, 0, 1, None, None)
                self.cuda.cuGraphLaunch(self.graph, 1)
            time.sleep(STEP_S + TOKEN_S * so.total_num_scheduled_tokens)
        elif self.kv_loads:
            # Only transfers in flight: the engine polls its connector every step.
            time.sleep(0.0005)
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_output,
        )

    def sample_tokens(self, grammar_output) -> None:
        return None

    def take_draft_token_ids(self):
        return None

    def shutdown(self) -> None:
        pass
