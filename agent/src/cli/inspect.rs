//! `inferscope inspect ID`: one request's timeline drawn in the terminal — arrival, queue,
//! prefill steps with their kernels, decode.
use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::Context as _;
use clap::Args;
use inferscope_model::clock::{ms_text, ns_to_ms};
use inferscope_proto::v1::agent::{GetRequestRequest, RequestTimeline};

use super::client::{ConnectArgs, runtime};

#[derive(Args, Debug)]
pub(super) struct InspectArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// The agent's request id, the response id (chatcmpl-…) or the caller's x-request-id.
    pub id: String,
    /// Steps drawn one per line (the rest are summarised).
    #[arg(long, default_value_t = 12)]
    pub steps: usize,
    /// Print the timeline as JSON instead.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: InspectArgs) -> anyhow::Result<()> {
    let timeline = runtime()?.block_on(async {
        let mut client = args.connect.client().await?;
        client
            .get_request(GetRequestRequest {
                request_id: args.id.clone(),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| anyhow::anyhow!("{}", s.message()))
            .with_context(|| format!("cannot get request {:?}", args.id))
    })?;
    if args.json {
        let record: serde_json::Value = timeline
            .request
            .as_ref()
            .and_then(|r| serde_json::from_str(&r.record_json).ok())
            .unwrap_or_default();
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!("{}", render(&timeline, 60, args.steps));
    }
    Ok(())
}

fn opt(v: Option<f64>) -> String {
    ms_text(v, 1, "-")
}

/// A bar of `width` columns with `[from, to)` of `[origin, origin + span)` filled.
fn bar(origin: u64, span: u64, from: u64, to: u64, width: usize, fill: char) -> String {
    let col = |t: u64| -> usize {
        if span == 0 {
            return 0;
        }
        ((t.saturating_sub(origin)) as f64 / span as f64 * width as f64).round() as usize
    };
    let (a, b) = (col(from).min(width), col(to).min(width));
    let b = if b <= a && to > from {
        (a + 1).min(width)
    } else {
        b
    };
    let mut s = String::with_capacity(width);
    for i in 0..width {
        s.push(if i >= a && i < b { fill } else { '·' });
    }
    s
}

/// The time axis that a section's rows share: `span` ns from `origin`, drawn `width` columns wide.
struct Lanes {
    origin: u64,
    span: u64,
    width: usize,
}

impl Lanes {
    /// One row: its name, `[from, to)` as a bar, and its start (from the origin) and length.
    fn row(&self, out: &mut String, name: &str, from: u64, to: u64, fill: char) {
        let _ = writeln!(
            out,
            "{:<10}{}  {:>8.1}ms {:>8.1}ms",
            name,
            bar(self.origin, self.span, from, to, self.width, fill),
            ns_to_ms(from.saturating_sub(self.origin)),
            ns_to_ms(to.saturating_sub(from))
        );
    }
}

/// One step's launches: counts, the host time before the first, the largest gap, top names.
fn launches_line(l: &inferscope_proto::v1::agent::StepLaunches) -> String {
    let names: Vec<String> = l
        .kernels
        .iter()
        .take(4)
        .chain(l.graphs.iter().take(2))
        .map(|c| {
            let short: String = c.name.chars().take(32).collect();
            format!("{short}×{}", c.launches)
        })
        .collect();
    let mut line = format!(
        "launches {} kernels ({} named) + {} graphs{} · {:.2} ms ({:.0}%) before the first · max gap {:.1} µs · {}",
        l.kernel_launches,
        l.named_launches,
        l.graph_launches,
        if l.sampled { " (sampled)" } else { "" },
        l.before_first_launch_ms,
        l.before_first_launch_share * 100.0,
        l.max_launch_gap_us,
        names.join(", ")
    );
    match &l.sources {
        Some(s) => {
            let _ = write!(
                line,
                " · source {}: {} both, {} uprobe only, {} shim only, {} named by the shim",
                l.source, s.both, s.uprobe_only, s.shim_only, s.named_by_shim
            );
        }
        None => {
            let _ = write!(line, " · source {}", l.source);
        }
    }
    for g in &l.graph_kernels {
        let kernels: Vec<String> = g
            .kernels
            .iter()
            .take(4)
            .map(|c| {
                let short: String = c.name.chars().take(32).collect();
                format!("{short}×{}", c.launches)
            })
            .collect();
        let _ = write!(
            line,
            "\n{:<10}{}: {} kernel nodes · {}",
            "",
            g.graph,
            g.nodes,
            kernels.join(", ")
        );
    }
    line
}

/// Which sources a request's step launches came from, e.g. `launch uprobes and shim merged`.
fn sources_of(launched: &[&inferscope_proto::v1::agent::StepLaunches]) -> &'static str {
    let has = |s: &str| launched.iter().any(|l| l.source == s);
    match (has("both"), has("uprobe"), has("shim")) {
        (true, _, _) => "launch uprobes and shim merged",
        (false, true, true) => "launch uprobes, and shim where they missed",
        (false, false, true) => "shim",
        _ => "launch uprobes",
    }
}

pub(super) fn render(t: &RequestTimeline, width: usize, max_steps: usize) -> String {
    let mut out = String::new();
    let Some(r) = &t.request else {
        return "the agent returned no request\n".into();
    };
    let _ = writeln!(out, "request   {}  ({} {})", r.request_id, r.method, r.path);
    if !r.response_id.is_empty() || !r.x_request_id.is_empty() {
        let _ = writeln!(
            out,
            "ids       response {}  x-request-id {}",
            r.response_id, r.x_request_id
        );
    }
    let _ = writeln!(
        out,
        "engine    {} (pid {})  model {}  status {}",
        r.engine,
        r.pid,
        if r.model.is_empty() { "-" } else { &r.model },
        r.status
    );
    let _ = writeln!(
        out,
        "tokens    prompt {}  completion {}  chunks {}",
        r.prompt_tokens.map_or("-".into(), |v| v.to_string()),
        r.completion_tokens.map_or("-".into(), |v| v.to_string()),
        r.output_chunks
    );
    let handoff = r
        .first_token_handoff_ms
        .map_or(String::new(), |h| format!(" + hand-off {h:.1} ms"));
    let _ = writeln!(
        out,
        "latency   TTFT {}  = queue {} + prefill {}{handoff};  TPOT {};  E2E {:.1} ms",
        opt(r.ttft_ms),
        opt(r.queue_wait_ms),
        opt(r.prefill_ms),
        opt(r.tpot_ms),
        r.e2e_ms
    );
    if let Some(deferred) = r.deferred_mono_ns {
        let requeued = r.requeued_mono_ns.map_or("-".into(), |t| {
            format!("{:.1} ms", ns_to_ms(t.saturating_sub(r.arrival_mono_ns)))
        });
        let _ = writeln!(
            out,
            "slot      none free: parked at {:.1} ms, taken back at {requeued}{}",
            ns_to_ms(deferred.saturating_sub(r.arrival_mono_ns)),
            r.engine_slot
                .map_or(String::new(), |s| format!(" by slot {s}"))
        );
    }
    out.push_str(&disagg_section(&r.record_json, width));
    if !r.unknown.is_empty() {
        let _ = writeln!(
            out,
            "unknown   {} (those layers were not observed for this request)",
            r.unknown.join(", ")
        );
    }
    let origin = r.arrival_mono_ns;
    let end = r.end_mono_ns.max(origin);
    let span = end - origin;
    let _ = writeln!(
        out,
        "\n{:<10}{:<width$}  {:>10} {:>10}",
        "",
        format!(
            "0 ms{:>w$}",
            format!("{:.0} ms", ns_to_ms(span)),
            w = width - 4
        ),
        "start",
        "length"
    );
    let lanes = Lanes {
        origin,
        span,
        width,
    };
    let mut row =
        |name: &str, from: u64, to: u64, fill: char| lanes.row(&mut out, name, from, to, fill);
    let admitted = (r.admitted_mono_ns != 0).then_some(r.admitted_mono_ns);
    // Prefill ends at the engine's own first token where a hook saw it, as in the record.
    let first = r
        .engine_first_token_mono_ns
        .or((r.first_token_mono_ns != 0).then_some(r.first_token_mono_ns));
    match (admitted, first) {
        (Some(a), Some(f)) => {
            row("queue", origin, a, '░');
            row("prefill", a, f, '█');
            row("decode", f, end, '▒');
        }
        (Some(a), None) => {
            row("queue", origin, a, '░');
            row("prefill", a, end, '█');
        }
        (None, Some(f)) => {
            row("to 1st tok", origin, f, '█');
            row("decode", f, end, '▒');
        }
        (None, None) => row("request", origin, end, '█'),
    }
    if !t.steps.is_empty() {
        let _ = writeln!(out, "\nsteps ({}):", t.steps.len());
        for (i, s) in t.steps.iter().enumerate() {
            if i == max_steps {
                let _ = writeln!(out, "  … {} more steps", t.steps.len() - max_steps);
                break;
            }
            let phase = s
                .members
                .iter()
                .find(|m| m.request_id == r.request_id)
                .map_or("?", |m| m.phase.as_str());
            let _ = writeln!(
                out,
                "{:<10}{}  {:>8.1}ms {:>8.1}ms  batch {} {}",
                phase,
                bar(origin, span, s.start_mono_ns, s.end_mono_ns, width, '▇'),
                ns_to_ms(s.start_mono_ns.saturating_sub(origin)),
                ns_to_ms(s.end_mono_ns.saturating_sub(s.start_mono_ns)),
                // The engine's own count: the timeline's copy of an IPC step also names this
                // request by the agent's id, beside its engine id.
                if s.sequences > 0 {
                    s.sequences
                } else {
                    s.members.len() as u64
                },
                if s.kernels > 0 {
                    format!("· {} kernels, GPU busy {:.2} ms", s.kernels, s.gpu_busy_ms)
                } else {
                    String::new()
                }
            );
            if let Some(l) = &s.launches {
                let _ = writeln!(out, "{:<10}{}", "", launches_line(l));
            }
        }
        let launched: Vec<_> = t.steps.iter().filter_map(|s| s.launches.as_ref()).collect();
        if !launched.is_empty() {
            let kernels: u64 = launched.iter().map(|l| l.kernel_launches).sum();
            let graphs: u64 = launched.iter().map(|l| l.graph_launches).sum();
            let named: u64 = launched.iter().map(|l| l.named_launches).sum();
            let share = launched
                .iter()
                .map(|l| l.before_first_launch_share)
                .sum::<f64>()
                / launched.len() as f64;
            let _ = writeln!(
                out,
                "
GPU launches (host enqueue; {}): {kernels} kernels ({named} named) and {graphs} graphs in {} steps; before the first launch: {:.0}% of a step on average",
                sources_of(&launched),
                launched.len(),
                share * 100.0
            );
        }
    }
    for (name, gpu) in [("prefill", &r.prefill_gpu), ("decode", &r.decode_gpu)] {
        if let Some(g) = gpu {
            let _ = writeln!(
                out,
                "\nGPU {name}: {} kernels, busy {:.2} ms, tensor cores {:.0}%, devices {:?}",
                g.kernels,
                g.busy_ms,
                g.tensor_core_share * 100.0,
                g.devices
            );
        }
    }
    if !t.kernels.is_empty() {
        let mut by_name: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for k in &t.kernels {
            let e = by_name.entry(k.name.as_str()).or_default();
            e.0 += 1;
            e.1 += k.end_mono_ns.saturating_sub(k.start_mono_ns);
        }
        let mut top: Vec<_> = by_name.into_iter().collect();
        top.sort_by_key(|b| std::cmp::Reverse(b.1.1));
        let _ = writeln!(out, "\ntop kernels by GPU time:");
        for (name, (count, ns)) in top.into_iter().take(8) {
            let short: String = name.chars().take(70).collect();
            let _ = writeln!(out, "  {:>9.3} ms  {:>5}×  {}", ns_to_ms(ns), count, short);
        }
    }
    out
}

/// The disaggregated (prefill/decode) view of a leg, from its record's `disagg`: which leg,
/// joined to which, and on the decode leg the whole request stitched, P's arrival to D's end.
fn disagg_section(record_json: &str, width: usize) -> String {
    let mut out = String::new();
    let Ok(record) = serde_json::from_str::<serde_json::Value>(record_json) else {
        return out;
    };
    let Some(d) = record.get("disagg") else {
        return out;
    };
    let text =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    let int = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    let role = text(d, "role").unwrap_or_else(|| "?".into());
    let scheme = text(d, "scheme").unwrap_or_else(|| "?".into());
    if role == "proxy" {
        proxy_section(&mut out, &record, d, width);
        return out;
    }
    let _ = match (text(d, "id"), text(d, "unjoined")) {
        (_, Some(why)) => writeln!(out, "disagg    {role} leg, not joined: {why} ({scheme})"),
        (Some(id), None) => match text(d, "peer_request_id") {
            Some(peer) => writeln!(
                out,
                "disagg    {role} leg of {id} ({scheme}); prefill leg {peer}"
            ),
            None => writeln!(out, "disagg    {role} leg of {id} ({scheme})"),
        },
        (None, None) => writeln!(out, "disagg    {role} leg ({scheme})"),
    };
    let Some(p_arrival) = int(d, "prefill_arrival_mono_ns").filter(|_| role == "decode") else {
        if role == "prefill" {
            let _ = writeln!(
                out,
                "          P queue {}  P prefill {}",
                opt(num(d, "prefill_queue_wait_ms")),
                opt(num(d, "prefill_ms"))
            );
        }
        return out;
    };
    let _ = writeln!(
        out,
        "stitched  TTFT {} from P's arrival: P queue {} + P prefill {} … hand-off {} … KV wait {} + D first step {}",
        opt(num(d, "ttft_ms")),
        opt(num(d, "prefill_queue_wait_ms")),
        opt(num(d, "prefill_ms")),
        opt(num(d, "handoff_ms")),
        opt(num(d, "kv_transfer_wait_ms")),
        opt(num(d, "first_decode_step_ms")),
    );
    if let Some(transfer) = num(d, "kv_transfer_ms") {
        let source = text(d, "kv_transfer_source").unwrap_or_else(|| "?".into());
        let _ = writeln!(
            out,
            "          KV transfer {transfer:.1} ms by the connector ({source}), within the KV wait"
        );
    }
    let (Some(d_arrival), Some(d_end)) =
        (int(&record, "arrival_mono_ns"), int(&record, "end_mono_ns"))
    else {
        return out;
    };
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let end = d_end.max(p_arrival);
    let span = end - p_arrival;
    let lanes = Lanes {
        origin: p_arrival,
        span,
        width,
    };
    let mut row =
        |name: &str, from: u64, to: u64, fill: char| lanes.row(&mut out, name, from, to, fill);
    let p_end = num(d, "handoff_ms").map(|h| d_arrival.saturating_sub(ns(h)));
    if let Some(p_end) = p_end {
        row("P leg", p_arrival, p_end, '█');
    }
    let queued = int(&record, "engine_queued_mono_ns");
    let admitted = int(&record, "admitted_mono_ns");
    if let (Some(q), Some(a)) = (queued, admitted) {
        row("KV wait", q, a, '░');
        if let Some(f) = int(&record, "engine_first_output_mono_ns") {
            row("D step 1", a, f, '█');
        }
    }
    row("D leg", d_arrival, end, '▒');
    out.push('\n');
    out
}

/// The P/D proxy's record of the client's request, joined to the decode leg it relayed: the
/// client's TTFT at the proxy, split into the proxy's hops and the servers' phases, drawn from
/// the proxy's arrival.
fn proxy_section(
    out: &mut String,
    record: &serde_json::Value,
    d: &serde_json::Value,
    width: usize,
) {
    let text =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    let int = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    let (Some(id), None) = (text(d, "id"), text(d, "unjoined")) else {
        let why = text(d, "unjoined").unwrap_or_else(|| "?".into());
        let _ = writeln!(out, "disagg    P/D proxy, not joined: {why}");
        return;
    };
    let scheme = text(d, "scheme").unwrap_or_else(|| "?".into());
    let _ = writeln!(
        out,
        "disagg    P/D proxy of {id} ({scheme}); prefill leg {}, decode leg {}",
        text(d, "prefill_request_id").unwrap_or_else(|| "?".into()),
        text(d, "peer_request_id").unwrap_or_else(|| "?".into()),
    );
    let _ = writeln!(
        out,
        "stitched  client TTFT {} at the proxy: proxy → P {} + P queue {} + P prefill {} … hand-off {} … KV wait {} + D first step {} … relay {}",
        opt(num(d, "client_ttft_ms")),
        opt(num(d, "proxy_to_prefill_ms")),
        opt(num(d, "prefill_queue_wait_ms")),
        opt(num(d, "prefill_ms")),
        opt(num(d, "handoff_ms")),
        opt(num(d, "kv_transfer_wait_ms")),
        opt(num(d, "first_decode_step_ms")),
        opt(num(d, "relay_ms")),
    );
    let _ = writeln!(
        out,
        "          servers' TTFT {} (P's arrival → D's first token)",
        opt(num(d, "ttft_ms"))
    );
    if let Some(transfer) = num(d, "kv_transfer_ms") {
        let source = text(d, "kv_transfer_source").unwrap_or_else(|| "?".into());
        let _ = writeln!(
            out,
            "          KV transfer {transfer:.1} ms by the connector ({source}), within the KV wait"
        );
    }
    let (Some(start), Some(end)) = (int(record, "arrival_mono_ns"), int(record, "end_mono_ns"))
    else {
        return;
    };
    let end = end.max(start);
    let span = end - start;
    let lanes = Lanes {
        origin: start,
        span,
        width,
    };
    let mut row = |name: &str, from: u64, to: u64, fill: char| lanes.row(out, name, from, to, fill);
    let p_arrival = int(d, "prefill_arrival_mono_ns");
    let d_arrival = int(d, "decode_arrival_mono_ns");
    if let Some(p) = p_arrival {
        row("→ P", start, p, '─');
    }
    let p_end = match (d_arrival, num(d, "handoff_ms")) {
        (Some(a), Some(h)) => Some(a.saturating_sub((h * 1e6).round() as u64)),
        _ => None,
    };
    if let (Some(p), Some(e)) = (p_arrival, p_end) {
        row("P leg", p, e, '█');
    }
    if let (Some(e), Some(a)) = (p_end, d_arrival) {
        row("hand-off", e, a, '─');
    }
    let d_first = int(d, "decode_first_token_mono_ns");
    if let (Some(a), Some(f)) = (d_arrival, d_first) {
        row("D → tok 1", a, f, '░');
    }
    if let (Some(f), Some(c)) = (d_first, int(record, "first_token_mono_ns")) {
        row("relay", f, c, '█');
    }
    row("proxy", start, end, '▒');
    out.push('\n');
}

#[cfg(test)]
mod tests {
    /// The P/D proxy's record draws the client's request from the proxy's arrival: its hops and
    /// the servers' phases between them.
    #[test]
    fn draws_the_proxy_hop() {
        let ms = 1_000_000u64;
        let proxy = serde_json::json!({
            "request_id": "3003-1-0", "arrival_mono_ns": 995 * ms, "end_mono_ns": 1201 * ms,
            "first_token_mono_ns": 1041 * ms,
            "disagg": {
                "id": "5be1f0c27a9d4e10", "role": "proxy", "scheme": "vllm_kv_transfer",
                "peer_request_id": "2002-7-0", "prefill_request_id": "1001-3-0",
                "prefill_arrival_mono_ns": 1000 * ms, "prefill_queue_wait_ms": 2.0,
                "prefill_ms": 7.0, "handoff_ms": 2.0, "kv_transfer_wait_ms": 20.0,
                "first_decode_step_ms": 4.0, "ttft_ms": 40.0, "proxy_arrival_mono_ns": 995 * ms,
                "proxy_to_prefill_ms": 5.0, "relay_ms": 1.0, "client_ttft_ms": 46.0,
                "decode_arrival_mono_ns": 1014 * ms, "decode_first_token_mono_ns": 1040 * ms
            }
        });
        let out = super::disagg_section(&proxy.to_string(), 40);
        println!("{out}");
        assert!(out.contains(
            "P/D proxy of 5be1f0c27a9d4e10 (vllm_kv_transfer); prefill leg 1001-3-0, decode leg 2002-7-0"
        ));
        assert!(
            out.contains("client TTFT 46.0 ms at the proxy: proxy → P 5.0 ms + P queue 2.0 ms")
        );
        assert!(out.contains("… relay 1.0 ms"));
        let row = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .to_owned()
        };
        assert!(row("→ P").ends_with("0.0ms      5.0ms"), "{out}");
        assert!(row("P leg").ends_with("5.0ms     12.0ms"), "{out}");
        assert!(row("hand-off").ends_with("17.0ms      2.0ms"), "{out}");
        assert!(row("D → tok 1").ends_with("19.0ms     26.0ms"), "{out}");
        assert!(row("relay").ends_with("45.0ms      1.0ms"), "{out}");
        assert!(row("proxy").ends_with("0.0ms    206.0ms"), "{out}");
        let unjoined = serde_json::json!({
            "disagg": {"role": "proxy", "unjoined": "decode_leg_not_seen"}
        });
        assert_eq!(
            super::disagg_section(&unjoined.to_string(), 40),
            "disagg    P/D proxy, not joined: decode_leg_not_seen\n"
        );
    }

    /// The decode leg of a request stitched to its prefill leg draws the whole request from
    /// P's arrival; an unjoined leg says why. (The docs' P/D page shows this output.)
    #[test]
    fn draws_the_stitched_disaggregated_request() {
        let ms = 1_000_000u64;
        let d = serde_json::json!({
            "request_id": "2002-7-0", "arrival_mono_ns": 1014 * ms, "end_mono_ns": 1200 * ms,
            "engine_queued_mono_ns": 1015 * ms, "admitted_mono_ns": 1035 * ms,
            "engine_first_output_mono_ns": 1039 * ms,
            "disagg": {
                "id": "5be1f0c27a9d4e10", "role": "decode", "scheme": "vllm_kv_transfer",
                "peer_request_id": "1001-3-0", "prefill_arrival_mono_ns": 1000 * ms,
                "prefill_queue_wait_ms": 2.0, "prefill_ms": 7.0, "handoff_ms": 2.0,
                "kv_transfer_wait_ms": 20.0, "first_decode_step_ms": 4.0, "ttft_ms": 40.0,
                "kv_transfer_ms": 12.5, "kv_transfer_source": "vllm_kv_connector_stats"
            }
        });
        let out = super::disagg_section(&d.to_string(), 40);
        println!("{out}");
        assert!(
            out.contains("decode leg of 5be1f0c27a9d4e10 (vllm_kv_transfer); prefill leg 1001-3-0")
        );
        assert!(out.contains("TTFT 40.0 ms from P's arrival: P queue 2.0 ms + P prefill 7.0 ms"));
        assert!(out.contains("KV wait 20.0 ms + D first step 4.0 ms"));
        assert!(out.contains(
            "KV transfer 12.5 ms by the connector (vllm_kv_connector_stats), within the KV wait"
        ));
        let kv = out.lines().find(|l| l.starts_with("KV wait")).unwrap();
        assert!(kv.ends_with("15.0ms     20.0ms"), "{kv}");
        let p = out.lines().find(|l| l.starts_with("P leg")).unwrap();
        assert!(p.ends_with("0.0ms     12.0ms"), "{p}");
        let unjoined = serde_json::json!({
            "disagg": {"role": "decode", "scheme": "vllm_kv_transfer", "unjoined": "prefill_leg_not_seen"}
        });
        assert_eq!(
            super::disagg_section(&unjoined.to_string(), 40),
            "disagg    decode leg, not joined: prefill_leg_not_seen (vllm_kv_transfer)\n"
        );
        assert_eq!(super::disagg_section("{}", 40), "");
    }
    use inferscope_proto::v1::agent::{Request, Step, StepMember};

    use super::*;

    #[test]
    fn draws_phases_in_proportion() {
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "1-2-0".into(),
                arrival_mono_ns: 0,
                admitted_mono_ns: 25_000_000,
                first_token_mono_ns: 50_000_000,
                end_mono_ns: 100_000_000,
                ttft_ms: Some(50.0),
                queue_wait_ms: Some(25.0),
                prefill_ms: Some(25.0),
                ..Default::default()
            }),
            steps: vec![Step {
                start_mono_ns: 25_000_000,
                end_mono_ns: 50_000_000,
                members: vec![StepMember {
                    request_id: "1-2-0".into(),
                    phase: "prefill".into(),
                }],
                ..Default::default()
            }],
            kernels: vec![],
        };
        let text = render(&t, 20, 5);
        let queue = text.lines().find(|l| l.starts_with("queue")).unwrap();
        assert!(queue.contains("░░░░░·····"), "{queue}");
        let prefill = text.lines().find(|l| l.starts_with("prefill ")).unwrap();
        assert!(prefill.contains("·····█████··········"), "{prefill}");
        assert!(text.contains("TTFT 50.0 ms  = queue 25.0 ms + prefill 25.0 ms"));
        assert!(text.contains("steps (1):"));
        assert!(!text.contains("slot "), "not deferred: {text}");
        assert!(!text.contains("launches"), "no launch probes: {text}");
    }

    #[test]
    fn steps_show_their_launches_and_the_request_sums_them() {
        use inferscope_proto::v1::agent::{NamedCount, StepLaunches};
        let launches = StepLaunches {
            source: "uprobe".into(),
            kernel_launches: 5,
            named_launches: 4,
            graph_launches: 2,
            before_first_launch_ms: 3.1,
            before_first_launch_share: 0.5,
            max_launch_gap_us: 21.5,
            kernels: vec![NamedCount {
                name: "late_kernel".into(),
                launches: 2,
            }],
            graphs: vec![NamedCount {
                name: "graph#1".into(),
                launches: 1,
            }],
            ..Default::default()
        };
        let step = |start: u64| Step {
            start_mono_ns: start,
            end_mono_ns: start + 6_000_000,
            launches: Some(launches.clone()),
            ..Default::default()
        };
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "r".into(),
                end_mono_ns: 20_000_000,
                ..Default::default()
            }),
            steps: vec![step(1_000_000), step(8_000_000)],
            kernels: vec![],
        };
        let text = render(&t, 20, 5);
        assert!(
            text.contains("launches 5 kernels (4 named) + 2 graphs · 3.10 ms (50%) before the first · max gap 21.5 µs · late_kernel×2, graph#1×1"),
            "{text}"
        );
        assert!(
            text.contains(
                "10 kernels (8 named) and 4 graphs in 2 steps; before the first launch: 50%"
            ),
            "{text}"
        );
        assert!(text.contains("· source uprobe"), "{text}");
        assert!(text.contains("(host enqueue; launch uprobes)"), "{text}");
    }

    /// A vLLM-shaped step (CUDA graph decode) where the shim runs too: the merged sources and
    /// the graph's kernels are shown.
    #[test]
    fn merged_steps_say_who_saw_what_and_list_each_graph_s_kernels() {
        use inferscope_proto::v1::agent::{GraphKernels, LaunchSources, NamedCount, StepLaunches};
        let named = |name: &str, launches: u64| NamedCount {
            name: name.into(),
            launches,
        };
        let launches = StepLaunches {
            source: "both".into(),
            kernel_launches: 1,
            named_launches: 1,
            graph_launches: 1,
            kernels: vec![named("sampler_kernel", 1)],
            graphs: vec![named("graph#3", 1)],
            sources: Some(LaunchSources {
                both: 2,
                uprobe_only: 0,
                shim_only: 0,
                named_by_shim: 1,
            }),
            graph_kernels: vec![GraphKernels {
                graph: "graph#3".into(),
                nodes: 3,
                kernels: vec![named("gemm", 2), named("rms_norm", 1)],
            }],
            ..Default::default()
        };
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "r".into(),
                arrival_mono_ns: 0,
                end_mono_ns: 20_000_000,
                ..Default::default()
            }),
            steps: vec![Step {
                start_mono_ns: 1_000_000,
                end_mono_ns: 7_000_000,
                launches: Some(launches),
                ..Default::default()
            }],
            kernels: vec![],
        };
        let text = render(&t, 20, 5);
        assert!(
            text.contains("· source both: 2 both, 0 uprobe only, 0 shim only, 1 named by the shim"),
            "{text}"
        );
        assert!(
            text.contains("graph#3: 3 kernel nodes · gemm×2, rms_norm×1"),
            "{text}"
        );
        assert!(
            text.contains("(host enqueue; launch uprobes and shim merged)"),
            "{text}"
        );
    }

    #[test]
    fn a_deferred_request_says_when_it_was_parked_and_taken_back() {
        let t = RequestTimeline {
            request: Some(Request {
                request_id: "1-2-0".into(),
                arrival_mono_ns: 0,
                admitted_mono_ns: 40_000_000,
                first_token_mono_ns: 60_000_000,
                end_mono_ns: 100_000_000,
                ttft_ms: Some(60.0),
                queue_wait_ms: Some(40.0),
                prefill_ms: Some(19.5),
                first_token_handoff_ms: Some(0.5),
                engine_first_token_mono_ns: Some(59_500_000),
                deferred_mono_ns: Some(2_000_000),
                requeued_mono_ns: Some(39_000_000),
                engine_slot: Some(1),
                ..Default::default()
            }),
            steps: vec![],
            kernels: vec![],
        };
        let text = render(&t, 20, 5);
        assert!(
            text.contains("TTFT 60.0 ms  = queue 40.0 ms + prefill 19.5 ms + hand-off 0.5 ms"),
            "{text}"
        );
        assert!(
            text.contains("none free: parked at 2.0 ms, taken back at 39.0 ms by slot 1"),
            "{text}"
        );
    }

    /// vLLM's steps list engine ids (`chatcmpl-…-<8 chars>`), not the agent's: the record's own
    /// step list (joined by the engine module) still draws each step with its phase and kernels.
    #[test]
    fn draws_vllm_steps_joined_by_engine_id() {
        use inferscope_model::{RequestRecord, StepMember as Member, StepRecord, StepRef};

        use crate::join::timeline::{KernelRecord, TimelineLimits};
        let step = |start: u64, end: u64, ids: &[&str]| StepRecord {
            pid: 9,
            engine: "vllm".into(),
            tid: 9,
            start_mono_ns: start,
            end_mono_ns: end,
            duration_ms: ns_to_ms(end - start),
            sequences: ids.len() as u64,
            prefilling: 0,
            requests: ids
                .iter()
                .map(|id| Member {
                    request_id: (*id).into(),
                    phase: "decode",
                })
                .collect(),
            start_from: Some("previous_step"),
            ..StepRecord::default()
        };
        let mut b = crate::join::testing::Driver::new(TimelineLimits::default());
        let engine_id = "chatcmpl-x-abcdef12";
        // A prefill chunk with no output (not listed by vLLM), its first token, a decode step.
        b.on_step(step(10_000_000, 20_000_000, &[]));
        b.on_step(step(20_000_000, 30_000_000, &[engine_id]));
        b.on_step(step(30_000_000, 40_000_000, &[engine_id]));
        for launch in [15_000_000, 25_000_000, 35_000_000, 36_000_000] {
            b.on_kernel(
                KernelRecord {
                    pid: 9,
                    name: "gemm".into(),
                    device_id: 0,
                    context_id: 1,
                    stream_id: 7,
                    correlation_id: 1,
                    launch_tid: 9,
                    launch_api: "cuLaunchKernel".into(),
                    launch_mono_ns: launch,
                    start_mono_ns: launch + 1_000,
                    end_mono_ns: launch + 500_000,
                    grid: [1, 1, 1],
                    block: [32, 1, 1],
                    static_shared_bytes: 0,
                    dynamic_shared_bytes: 0,
                    graph_id: 0,
                    graph_node_id: 0,
                    tensor_core: false,
                },
                1,
            );
        }
        let phase = |end: u64, phase| StepRef {
            pid: 9,
            end_mono_ns: end,
            phase,
        };
        let record = RequestRecord {
            request_id: "9-1-0".into(),
            pid: 9,
            engine: "vllm".into(),
            arrival_mono_ns: 5_000_000,
            admitted_mono_ns: Some(10_000_000),
            first_token_mono_ns: Some(31_000_000),
            end_mono_ns: 41_000_000,
            prefill_steps: Some(2),
            decode_steps: Some(1),
            engine_steps: vec![
                phase(20_000_000, "prefill"),
                phase(30_000_000, "prefill"),
                phase(40_000_000, "decode"),
            ],
            ..Default::default()
        };
        let mut out = Vec::new();
        b.on_request(record, 2, &mut out);
        b.flush(3, &mut out);
        let t = crate::export::proto_conv::timeline(&out[0]);
        let text = render(&t, 40, 12);
        assert!(text.contains("steps (3):"), "{text}");
        // Step rows (each followed by its launch line, indented: the shim's launches, as no
        // launch uprobe saw them).
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("steps ("))
            .skip(1)
            .filter(|l| !l.starts_with(' '))
            .take(3)
            .collect();
        assert_eq!(
            text.matches("· source shim: 0 both, 0 uprobe only").count(),
            3,
            "{text}"
        );
        for (row, (phase, kernels)) in
            rows.iter()
                .zip([("prefill", 1), ("prefill", 1), ("decode", 2)])
        {
            assert!(row.starts_with(phase), "{row}\n{text}");
            assert!(
                row.contains(&format!("· {kernels} kernels")),
                "{row}\n{text}"
            );
        }
        assert!(text.contains("GPU prefill: 2 kernels"), "{text}");
        assert!(text.contains("GPU decode: 2 kernels"), "{text}");
    }

    /// SGLang's timed step (its first prefill, seen on the tokenizer manager's IPC) names the
    /// SGLang rid; its kernels ran in the scheduler process. The record's own step list draws it
    /// with the scheduler's kernels, and none of the server's.
    #[test]
    fn draws_the_sglang_prefill_step_with_the_scheduler_kernels() {
        use inferscope_model::{RequestRecord, StepMember as Member, StepRecord, StepRef};

        use crate::join::timeline::{KernelRecord, TimelineLimits};
        let mut b = crate::join::testing::Driver::new(TimelineLimits::default());
        b.on_step(StepRecord {
            pid: 20,
            engine: "sglang".into(),
            tid: 21,
            start_mono_ns: 10_000_000,
            end_mono_ns: 30_000_000,
            duration_ms: 20.0,
            sequences: 2,
            prefilling: 2,
            requests: ["0b6c0d6a", "7f3e9a10"]
                .iter()
                .map(|id| Member {
                    request_id: (*id).into(),
                    phase: "prefill",
                })
                .collect(),
            start_from: Some("forward_entry"),
            kernel_pid: Some(30),
            ..StepRecord::default()
        });
        for (pid, launch) in [(30, 12_000_000), (30, 25_000_000), (20, 26_000_000)] {
            b.on_kernel(
                KernelRecord {
                    pid,
                    name: "gemm".into(),
                    device_id: 0,
                    context_id: 1,
                    stream_id: 7,
                    correlation_id: 1,
                    launch_tid: pid,
                    launch_api: "cuLaunchKernel".into(),
                    launch_mono_ns: launch,
                    start_mono_ns: launch + 1_000,
                    end_mono_ns: launch + 500_000,
                    grid: [1, 1, 1],
                    block: [32, 1, 1],
                    static_shared_bytes: 0,
                    dynamic_shared_bytes: 0,
                    graph_id: 0,
                    graph_node_id: 0,
                    tensor_core: false,
                },
                1,
            );
        }
        let record = RequestRecord {
            request_id: "20-1-0".into(),
            pid: 20,
            engine: "sglang".into(),
            arrival_mono_ns: 5_000_000,
            admitted_mono_ns: Some(10_000_000),
            first_token_mono_ns: Some(31_000_000),
            end_mono_ns: 41_000_000,
            engine_unknown: vec!["prefill_steps", "decode_steps"],
            engine_steps: vec![StepRef {
                pid: 20,
                end_mono_ns: 30_000_000,
                phase: "prefill",
            }],
            ..Default::default()
        };
        let mut out = Vec::new();
        b.on_request(record, 2, &mut out);
        b.flush(3, &mut out);
        let t = crate::export::proto_conv::timeline(&out[0]);
        let text = render(&t, 40, 12);
        assert!(text.contains("steps (1):"), "{text}");
        let row = text
            .lines()
            .skip_while(|l| !l.starts_with("steps ("))
            .nth(1)
            .unwrap_or_default();
        assert!(row.starts_with("prefill"), "{row}\n{text}");
        assert!(row.contains("· 2 kernels"), "{row}\n{text}");
        assert!(text.contains("GPU prefill: 2 kernels"), "{text}");
        assert!(text.contains("GPU decode: 0 kernels"), "{text}");
    }
}
