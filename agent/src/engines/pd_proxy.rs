//! Proxies (routers) in front of disaggregated prefill/decode servers: the process a client
//! talks to, which sends the request to a prefill server, then to a decode server, and relays
//! the decode server's stream. Traced as an HTTP server (its client-facing side); the stitcher
//! (`join::disagg`) joins its record to the decode leg whose stream it relayed.
use super::{Engine, ProcessInfo};

pub(super) struct PdProxy;

/// Script names of known P/D proxies, matched as an argument's file name:
/// vLLM's examples (`examples/online_serving/disaggregated_serving/toy_proxy_server.py` and
/// `disagg_proxy_demo.py`, the P2P NCCL example's `disagg_proxy_p2p_nccl_xpyd.py`, LMCache's
/// `disagg_proxy_server.py`) and the test suite's `tests/engine/vllm/disagg_proxy.py`, which
/// follows the toy proxy.
const SCRIPTS: &[&str] = &[
    "toy_proxy_server.py",
    "disagg_proxy_demo.py",
    "disagg_proxy_p2p_nccl_xpyd.py",
    "disagg_proxy_server.py",
    "disagg_proxy.py",
];

/// Python modules of known P/D routers (`python -m MODULE`): SGLang's mini load balancer.
const MODULES: &[&str] = &["sglang.srt.disaggregation.mini_lb"];

/// Routers that are P/D proxies only in their P/D mode: SGLang's router (`python -m
/// sglang_router.launch_router --pd-disaggregation ...`), otherwise a data-parallel balancer.
const PD_ROUTERS: &[&str] = &["sglang_router.launch_router"];
const PD_FLAG: &str = "--pd-disaggregation";

impl Engine for PdProxy {
    fn name(&self) -> &'static str {
        "pd_proxy"
    }

    fn claims(&self, p: &ProcessInfo) -> bool {
        let mut args = p.cmdline.split_whitespace();
        let script = args.clone().any(|a| {
            let name = a.rsplit('/').next().unwrap_or(a);
            SCRIPTS.contains(&name)
        });
        let module = args.clone().any(|a| MODULES.contains(&a));
        let router = args.clone().any(|a| PD_ROUTERS.contains(&a)) && args.any(|a| a == PD_FLAG);
        script || module || router
    }

    fn pd_proxy(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(cmdline: &str) -> ProcessInfo {
        ProcessInfo {
            tgid: 1,
            cmdline: cmdline.into(),
            mapped_files: Vec::new(),
        }
    }

    #[test]
    fn claims_known_proxies_by_command_line() {
        for claimed in [
            "python3 examples/online_serving/disaggregated_serving/toy_proxy_server.py --port 8000 --prefiller-port 8100",
            "python disagg_proxy_demo.py --model m --prefill localhost:8100 --decode localhost:8200",
            "/v/bin/python3 /r/tests/engine/vllm/disagg_proxy.py --port 1 --prefill a:1 --decode b:2",
            "python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://p:30000 --decode http://d:30001",
            "python -m sglang.srt.disaggregation.mini_lb --prefill http://p:30000 --decode http://d:30001",
        ] {
            assert!(PdProxy.claims(&p(claimed)), "{claimed}");
        }
        for not in [
            // SGLang's router without P/D mode is a data-parallel balancer.
            "python3 -m sglang_router.launch_router --worker-urls http://a:1 http://b:2",
            // A file that only contains a known name, and vLLM's servers.
            "python3 my_disagg_proxy.py.bak",
            "vllm serve m --kv-transfer-config {}",
            "python3 serve.py --note toy_proxy_server",
        ] {
            assert!(!PdProxy.claims(&p(not)), "{not}");
        }
    }
}
