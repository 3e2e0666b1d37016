//! Request timelines as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing
//! open: one track per request (queue, prefill, decode), one per engine step thread, one per GPU
//! stream (kernels). Times are CLOCK_MONOTONIC microseconds.
use std::collections::BTreeSet;

use inferscope_proto::v1::agent::RequestTimeline;
use serde_json::{Value, json};

/// Synthetic process ids for the three kinds of track.
const REQUESTS_PID: u64 = 1;
const STEPS_PID_BASE: u64 = 1_000_000;
const GPU_PID_BASE: u64 = 2_000_000;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn span(
    name: &str,
    cat: &str,
    pid: u64,
    tid: u64,
    start_ns: u64,
    end_ns: u64,
    args: Value,
) -> Value {
    json!({
        "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
        "ts": us(start_ns), "dur": us(end_ns.saturating_sub(start_ns)), "args": args,
    })
}

fn meta(kind: &str, pid: u64, tid: Option<u64>, name: &str) -> Value {
    let mut v = json!({"name": kind, "ph": "M", "pid": pid, "args": {"name": name}});
    if let Some(tid) = tid {
        v["tid"] = json!(tid);
    }
    v
}

pub(crate) fn trace(timelines: &[RequestTimeline]) -> Value {
    let mut events = vec![meta("process_name", REQUESTS_PID, None, "requests")];
    let mut step_threads = BTreeSet::new();
    let mut gpu_streams = BTreeSet::new();
    let mut seen_steps = BTreeSet::new();
    let mut seen_kernels = BTreeSet::new();
    for (i, t) in timelines.iter().enumerate() {
        let Some(r) = &t.request else { continue };
        let tid = i as u64 + 1;
        // A disaggregated request's legs are named by their shared id, so the two tracks sort
        // together and a search for the id finds both.
        let disagg = serde_json::from_str::<Value>(&r.record_json)
            .ok()
            .and_then(|v| v.get("disagg").cloned());
        let leg = disagg.as_ref().map_or(String::new(), |d| {
            format!(
                "disagg {} {} ",
                d.get("id").and_then(Value::as_str).unwrap_or("unjoined"),
                d.get("role").and_then(Value::as_str).unwrap_or("?")
            )
        });
        events.push(meta(
            "thread_name",
            REQUESTS_PID,
            Some(tid),
            &format!("{leg}{} {}", r.request_id, r.x_request_id),
        ));
        let end = r.end_mono_ns.max(r.arrival_mono_ns);
        events.push(span(
            &format!("{} {}", r.method, r.path),
            "request",
            REQUESTS_PID,
            tid,
            r.arrival_mono_ns,
            end,
            json!({
                "request_id": r.request_id, "ttft_ms": r.ttft_ms, "queue_wait_ms": r.queue_wait_ms,
                "prefill_ms": r.prefill_ms, "tpot_ms": r.tpot_ms, "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens, "unknown": r.unknown,
                "disagg": disagg,
            }),
        ));
        let admitted = (r.admitted_mono_ns != 0).then_some(r.admitted_mono_ns);
        let first = (r.first_token_mono_ns != 0).then_some(r.first_token_mono_ns);
        if let Some(a) = admitted {
            events.push(span(
                "queue",
                "phase",
                REQUESTS_PID,
                tid,
                r.arrival_mono_ns,
                a,
                json!({}),
            ));
            events.push(span(
                "prefill",
                "phase",
                REQUESTS_PID,
                tid,
                a,
                first.unwrap_or(end),
                json!({}),
            ));
        } else if let Some(f) = first {
            events.push(span(
                "time_to_first_token",
                "phase",
                REQUESTS_PID,
                tid,
                r.arrival_mono_ns,
                f,
                json!({}),
            ));
        }
        if let Some(f) = first {
            events.push(span(
                "decode",
                "phase",
                REQUESTS_PID,
                tid,
                f,
                end,
                json!({}),
            ));
        }
        for s in &t.steps {
            // Steps are shared by the requests of a batch: draw each once.
            if !seen_steps.insert((s.pid, s.tid, s.start_mono_ns)) {
                continue;
            }
            let pid = STEPS_PID_BASE + u64::from(s.pid);
            step_threads.insert((pid, u64::from(s.tid), s.engine.clone(), s.pid));
            let members: Vec<String> = s
                .members
                .iter()
                .map(|m| format!("{}:{}", m.request_id, m.phase))
                .collect();
            events.push(span(
                "step",
                "step",
                pid,
                u64::from(s.tid),
                s.start_mono_ns,
                s.end_mono_ns,
                json!({"batch_tokens": s.batch_tokens, "members": members, "kernels": s.kernels, "gpu_busy_ms": s.gpu_busy_ms}),
            ));
            if let Some(l) = &s.launches {
                // Host side of the step, from the launch uprobes: the CPU work before the GPU
                // got its first launch, and the launches (enqueue times, not GPU execution).
                let first = s.start_mono_ns + (l.before_first_launch_ms * 1e6) as u64;
                let kernels: Vec<String> = l
                    .kernels
                    .iter()
                    .chain(&l.graphs)
                    .map(|c| format!("{}×{}", c.name, c.launches))
                    .collect();
                // Each graph's kernels (from the shim), as "graph#1: gemm×2, rms_norm×1".
                let graph_kernels: Vec<String> = l
                    .graph_kernels
                    .iter()
                    .map(|g| {
                        let kernels: Vec<String> = g
                            .kernels
                            .iter()
                            .map(|c| format!("{}×{}", c.name, c.launches))
                            .collect();
                        format!("{}: {}", g.graph, kernels.join(", "))
                    })
                    .collect();
                events.push(span(
                    "host before first launch",
                    "launches",
                    pid,
                    u64::from(s.tid),
                    s.start_mono_ns,
                    first.min(s.end_mono_ns),
                    json!({"share_of_step": l.before_first_launch_share}),
                ));
                events.push(span(
                    "launches",
                    "launches",
                    pid,
                    u64::from(s.tid),
                    first.min(s.end_mono_ns),
                    s.end_mono_ns,
                    json!({
                        "source": l.source, "kernel_launches": l.kernel_launches,
                        "graph_launches": l.graph_launches, "named_launches": l.named_launches,
                        "max_launch_gap_us": l.max_launch_gap_us, "sampled": l.sampled,
                        "kernels": kernels,
                        "sources": l.sources.as_ref().map(|s| json!({
                            "both": s.both, "uprobe_only": s.uprobe_only,
                            "shim_only": s.shim_only, "named_by_shim": s.named_by_shim,
                        })),
                        "graph_kernels": graph_kernels,
                    }),
                ));
            }
        }
        for k in &t.kernels {
            if !seen_kernels.insert((k.device_id, k.correlation_id, k.start_mono_ns)) {
                continue;
            }
            let pid = GPU_PID_BASE + u64::from(k.device_id);
            gpu_streams.insert((pid, u64::from(k.stream_id), k.device_id));
            events.push(span(
                &k.name,
                "kernel",
                pid,
                u64::from(k.stream_id),
                k.start_mono_ns,
                k.end_mono_ns,
                json!({
                    "grid": [k.grid_x, k.grid_y, k.grid_z], "block": [k.block_x, k.block_y, k.block_z],
                    "tensor_core": k.tensor_core, "graph_id": k.graph_id, "correlation_id": k.correlation_id,
                }),
            ));
        }
    }
    for (pid, tid, engine, os_pid) in step_threads {
        events.push(meta(
            "process_name",
            pid,
            None,
            &format!("{engine} steps (pid {os_pid})"),
        ));
        events.push(meta(
            "thread_name",
            pid,
            Some(tid),
            &format!("scheduler thread {tid}"),
        ));
    }
    for (pid, stream, device) in gpu_streams {
        events.push(meta("process_name", pid, None, &format!("GPU {device}")));
        events.push(meta(
            "thread_name",
            pid,
            Some(stream),
            &format!("stream {stream}"),
        ));
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

#[cfg(test)]
mod tests {
    use inferscope_proto::v1::{
        agent::{Request, Step, StepMember},
        shim::Kernel,
    };

    use super::*;

    /// Both legs of a disaggregated request are named by their shared id.
    #[test]
    fn disaggregated_legs_share_their_id() {
        let leg = |id: &str, role: &str| RequestTimeline {
            request: Some(Request {
                request_id: id.into(),
                arrival_mono_ns: 1_000_000,
                end_mono_ns: 2_000_000,
                record_json: format!(r#"{{"disagg":{{"id":"ab12","role":"{role}"}}}}"#),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = trace(&[leg("p", "prefill"), leg("d", "decode")]);
        let names: Vec<&str> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert!(names.contains(&"disagg ab12 prefill p "), "{names:?}");
        assert!(names.contains(&"disagg ab12 decode d "), "{names:?}");
    }

    #[test]
    fn one_track_per_request_step_thread_and_stream() {
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "r1".into(),
                method: "POST".into(),
                path: "/v1/chat/completions".into(),
                arrival_mono_ns: 1_000_000,
                admitted_mono_ns: 2_000_000,
                first_token_mono_ns: 5_000_000,
                end_mono_ns: 9_000_000,
                ..Default::default()
            }),
            steps: vec![Step {
                pid: 42,
                tid: 43,
                engine: "llama.cpp".into(),
                start_mono_ns: 2_000_000,
                end_mono_ns: 5_000_000,
                members: vec![StepMember {
                    request_id: "r1".into(),
                    phase: "prefill".into(),
                }],
                ..Default::default()
            }],
            kernels: vec![Kernel {
                name: "gemm".into(),
                stream_id: 7,
                start_mono_ns: 2_100_000,
                end_mono_ns: 2_200_000,
                ..Default::default()
            }],
        };
        let v = trace(&[t.clone(), t]);
        let events = v["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
        for want in ["queue", "prefill", "decode", "step", "gemm"] {
            assert!(names.contains(&want), "{want} missing");
        }
        let steps = events.iter().filter(|e| e["name"] == "step").count();
        assert_eq!(steps, 1, "a shared step is drawn once");
        let prefill = events.iter().find(|e| e["name"] == "prefill").unwrap();
        assert_eq!(prefill["ts"], 2000.0);
        assert_eq!(prefill["dur"], 3000.0);
    }

    #[test]
    fn a_step_with_launches_shows_its_host_time_before_the_first() {
        use inferscope_proto::v1::agent::{NamedCount, StepLaunches};
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "r1".into(),
                arrival_mono_ns: 0,
                end_mono_ns: 10_000_000,
                ..Default::default()
            }),
            steps: vec![Step {
                pid: 42,
                tid: 43,
                start_mono_ns: 2_000_000,
                end_mono_ns: 6_000_000,
                launches: Some(StepLaunches {
                    source: "uprobe".into(),
                    kernel_launches: 5,
                    graph_launches: 1,
                    before_first_launch_ms: 1.0,
                    before_first_launch_share: 0.25,
                    kernels: vec![NamedCount {
                        name: "gemm".into(),
                        launches: 5,
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            kernels: vec![],
        };
        let v = trace(&[t]);
        let events = v["traceEvents"].as_array().unwrap();
        let before = events
            .iter()
            .find(|e| e["name"] == "host before first launch")
            .unwrap();
        assert_eq!(
            (before["ts"].as_f64(), before["dur"].as_f64()),
            (Some(2000.0), Some(1000.0))
        );
        let launches = events.iter().find(|e| e["name"] == "launches").unwrap();
        assert_eq!(launches["tid"], 43);
        assert_eq!(launches["args"]["kernel_launches"], 5);
        assert_eq!(launches["args"]["kernels"][0], "gemm×5");
        assert_eq!(launches["args"]["source"], "uprobe");
        assert!(launches["args"]["sources"].is_null());
    }

    #[test]
    fn a_merged_step_shows_its_sources_and_graphs_kernels() {
        use inferscope_proto::v1::agent::{GraphKernels, LaunchSources, NamedCount, StepLaunches};
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "r1".into(),
                end_mono_ns: 10_000_000,
                ..Default::default()
            }),
            steps: vec![Step {
                pid: 42,
                tid: 43,
                start_mono_ns: 2_000_000,
                end_mono_ns: 6_000_000,
                launches: Some(StepLaunches {
                    source: "both".into(),
                    graph_launches: 1,
                    graphs: vec![NamedCount {
                        name: "graph#1".into(),
                        launches: 1,
                    }],
                    sources: Some(LaunchSources {
                        both: 1,
                        ..Default::default()
                    }),
                    graph_kernels: vec![GraphKernels {
                        graph: "graph#1".into(),
                        nodes: 2,
                        kernels: vec![NamedCount {
                            name: "gemm".into(),
                            launches: 2,
                        }],
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            kernels: vec![],
        };
        let v = trace(&[t]);
        let events = v["traceEvents"].as_array().unwrap();
        let launches = events.iter().find(|e| e["name"] == "launches").unwrap();
        assert_eq!(launches["args"]["source"], "both");
        assert_eq!(launches["args"]["sources"]["both"], 1);
        assert_eq!(launches["args"]["graph_kernels"][0], "graph#1: gemm×2");
    }
}
