"""A KV connector for disaggregated prefill/decode on the test engine, with vLLM's own
scheduler-side state machine and the hand-off NIXL uses (kv_transfer_params): the prefill
server (kv_producer) answers with `do_remote_prefill`, `remote_engine_id`, `remote_request_id`,
`remote_block_ids`, `remote_host`, `remote_port`; the decode server (kv_consumer) loads the
prompt's KV "asynchronously", so its scheduler keeps the request WAITING_FOR_REMOTE_KVS until
the worker reports the blocks received. The worker side is played by the test worker
(worker.py), which reports a load finished after a modelled delay: `INFERSCOPE_VLLM_KV_MS`
(default 20), or the number in the file `INFERSCOPE_VLLM_KV_MS_FILE` when it exists (re-read
every load, so a test can slow the transfer down mid-run), plus 0-8 ms fixed by the request id
(`INFERSCOPE_VLLM_KV_JITTER=0`: none); it reports its transfers with NIXL's own stats class, so
vLLM sends their times over its IPC and serves `vllm:nixl_xfer_time_seconds`.

    --kv-transfer-config '{"kv_connector": "InferscopeKvConnector",
        "kv_connector_module_path": "inferscope_vllm.connector", "kv_role": "kv_consumer"}'
"""
import os
import uuid
import zlib
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)


def transfer_delay_s() -> float:
    path = os.environ.get("INFERSCOPE_VLLM_KV_MS_FILE")
    if path:
        try:
            with open(path) as f:
                return float(f.read().strip()) / 1e3
        except (OSError, ValueError):
            pass
    return float(os.environ.get("INFERSCOPE_VLLM_KV_MS", "20")) / 1e3


def transfer_jitter_s(request_id: str) -> float:
    """0-8 ms added to one request's modelled transfer, fixed by its id (with
    `INFERSCOPE_VLLM_KV_JITTER=0`, none)."""
    if os.environ.get("INFERSCOPE_VLLM_KV_JITTER", "1") == "0":
        return 0.0
    return (zlib.crc32(request_id.encode()) % 8000) / 1e6


@dataclass
class LoadMetadata(KVConnectorMetadata):
    # Engine request ids whose remote KV the worker starts loading this step.
    loads: list = field(default_factory=list)


class InferscopeKvConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.engine_id = str(uuid.uuid4())
        self.port = int(os.environ.get("INFERSCOPE_VLLM_KV_PORT", "5600"))
        self._to_load: list = []
        # Engine request ids whose load started (a request asks once).
        self._loading: set = set()

    # Scheduler side.
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill") and request.request_id not in self._loading:
            count = len(request.prompt_token_ids or []) - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill") and num_external_tokens > 0:
            self._loading.add(request.request_id)
            self._to_load.append(request.request_id)

    def build_connector_meta(self, scheduler_output):
        meta = LoadMetadata(loads=self._to_load)
        self._to_load = []
        return meta

    def request_finished(self, request, block_ids):
        self._loading.discard(request.request_id)
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        # As NIXL's scheduler answers (the blocks are freed at once: the fake transfer needs
        # none of them).
        blocks = list(block_ids[0]) if block_ids and isinstance(block_ids[0], (list, tuple)) else list(block_ids or [])
        return False, dict(
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_block_ids=blocks,
            remote_engine_id=self.engine_id,
            remote_request_id=request.request_id,
            remote_host="127.0.0.1",
            remote_port=self.port,
            tp_size=1,
            remote_num_tokens=request.num_computed_tokens,
        )

    # The connector's stats are NIXL's (the test worker reports its transfers with vLLM's
    # NixlKVConnectorStats), so the API server logs them and exports vLLM's own
    # `vllm:nixl_xfer_time_seconds` histogram, as it does for NIXL.
    @classmethod
    def build_kv_connector_stats(cls, data=None):
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

        return NixlKVConnectorStats(data=data) if data is not None else NixlKVConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlPromMetrics

        return NixlPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # Worker side: played by the test worker (worker.py), never instantiated there.
    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass
