//! The report for people: the decomposition table, the cause in words, the evidence lines.
use std::fmt::Write as _;

use inferscope_model::clock::ms_text;

use super::{Cause, Diagnosis, LoadForm, Pair, Phase, Test, decide::fmt_num};

fn meaning(c: Cause) -> &'static str {
    match c {
        Cause::TrafficSpike => {
            "demand rose while per-step service time did not: more requests per second (open loop) or more requests in the system at once (closed loop: more clients, each waiting for its answer); the extra ones waited for a free slot"
        }
        Cause::KvPressure => {
            "the KV cache ran full (high usage or preemptions), so the engine admitted fewer requests than arrived"
        }
        Cause::KvTransfer => {
            "disaggregated serving: the decode server waited longer for the prefill server's KV cache (the transfer, or the decode server's queue before it could start it), so the first token came later though each server's own work did not grow"
        }
        Cause::PromptGrowth => "prompts got longer, so each prefill takes longer",
        Cause::PrefixCacheMiss => {
            "prompts did not grow, but the engine's prefix cache served less of them, so each prefill computes more tokens: requests moved away from the replica holding their prefix (a routing change), the cache was evicted (memory pressure), or the shared prefix changed"
        }
        Cause::DegradedDevice => {
            "the same work runs slower on the device (steps of the same size take longer): a throttled, contended or faulty device"
        }
        Cause::SchedulerConfig => {
            "the scheduler's settings cut capacity: prefills take more engine steps at unchanged prompt sizes (a smaller batch / token budget splits them), or steps carry fewer requests while others wait (fewer slots / sequences)"
        }
        Cause::BatchGrowth => {
            "each decode step carried more requests (more running at once), so every request waits longer between its tokens though the step cost per request did not grow"
        }
        Cause::PrefillInterference => {
            "the requests' decode steps also ran other requests' prefill (chunked prefill mixed into decode), and those steps took longer: the scheduler's trade of TTFT for TPOT"
        }
        Cause::None => "no measured signal explains it",
    }
}

/// The first question's table: every profile in both windows.
fn profiles_table(out: &mut String, d: &Diagnosis) {
    if d.profiles.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<14}{:>20}{:>20}",
        "Profile", "baseline P50 / P99", "incident P50 / P99"
    );
    for p in &d.profiles {
        let cell = |a: Option<f64>, b: Option<f64>| match p.profile {
            super::Profile::SuccessRate => {
                a.map_or("?".to_owned(), |v| format!("{:.1}%", v * 100.0))
            }
            _ => format!("{} / {}", ms(a), ms(b)),
        };
        let _ = writeln!(
            out,
            "  {:<14}{:>20}{:>20}   {}",
            p.profile.as_str(),
            cell(p.p50.baseline, p.p99.baseline),
            cell(p.p50.window, p.p99.window),
            if p.regressed { "REGRESSED" } else { "" }
        );
    }
    let _ = writeln!(out);
}

fn evidence_lines(out: &mut String, evidence: &[super::Evidence]) {
    for e in evidence {
        let mark = match (e.test, e.crossed) {
            (Test::Context, _) => "[.]",
            (_, true) => "[x]",
            (_, false) => "[ ]",
        };
        let ratio = e.ratio.map_or(String::new(), |r| format!("x{r:.2}"));
        let rule = match (e.test, e.threshold) {
            (Test::Ratio, Some(th)) => format!("needs x{th}"),
            (Test::AtLeast, Some(th)) => format!("needs >= {th}"),
            (Test::RatioAtMost, Some(th)) => format!("needs <= x{th}"),
            _ => String::new(),
        };
        let points = if e.points_to == Cause::None {
            String::new()
        } else {
            format!(" -> {}", e.points_to.as_str())
        };
        let _ = writeln!(
            out,
            "  {mark} {:<32}{:>9} -> {:<9}{:<9}{:<7} {:<14}{points}",
            e.signal,
            fmt_num(e.baseline),
            fmt_num(e.window),
            e.unit,
            ratio,
            rule
        );
        if let Some(detail) = &e.detail {
            let _ = writeln!(out, "      {detail}");
        }
    }
}

/// The TPOT / ITL branch and the error branch, where they ran.
fn other_branches(out: &mut String, d: &Diagnosis) {
    if let Some(t) = &d.tpot {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "TPOT / ITL: {} - {}",
            t.cause.as_str(),
            meaning(t.cause)
        );
        evidence_lines(out, &t.evidence);
        if !t.slowest_requests.is_empty() {
            let _ = writeln!(
                out,
                "  slowest requests (TPOT; decode steps, requests per step, share of decode time with prefill, preemptions, longest step):"
            );
            for r in &t.slowest_requests {
                let _ = writeln!(
                    out,
                    "    {} {} ms; {} steps, {} req/step, {} with prefill, {} preempted, longest {} ms",
                    r.request_id,
                    fmt_num(r.tpot_ms),
                    r.decode_steps,
                    fmt_num(r.batch_mean),
                    fmt_num(r.prefill_share),
                    r.preemptions.map_or("?".to_owned(), |p| p.to_string()),
                    fmt_num(r.longest_step_ms)
                );
            }
        }
    }
    if let Some(e) = &d.errors {
        let _ = writeln!(out);
        let _ = writeln!(out, "Errors: {}", e.summary);
        for f in &e.failures {
            let _ = writeln!(
                out,
                "  {:<16}{:>6} -> {:<6} {}",
                f.kind.as_str(),
                f.count.baseline,
                f.count.window,
                f.requests.join(", ")
            );
        }
    }
}

fn ms(v: Option<f64>) -> String {
    ms_text(v, 0, "?")
}

fn row(out: &mut String, name: &str, p: Pair<Option<f64>>) {
    let change = match (p.baseline, p.window) {
        (Some(b), Some(w)) => {
            let ratio = if b > 0.0 {
                format!("  x{:.1}", w / b)
            } else {
                String::new()
            };
            format!("{:+.0} ms{ratio}", w - b)
        }
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  {name:<18}{:>12}{:>12}   {change}",
        ms(p.baseline),
        ms(p.window)
    );
}

/// A plain-text report; reads without knowing the code.
pub fn render(d: &Diagnosis) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", d.summary);
    let _ = writeln!(out);
    profiles_table(&mut out, d);
    let _ = writeln!(
        out,
        "  {:<18}{:>12}{:>12}   change",
        "P99 (ms)", "baseline", "incident"
    );
    row(&mut out, "TTFT", d.ttft_p99_ms);
    row(&mut out, "  queue wait", d.queue_wait_p99_ms);
    row(&mut out, "  prefill", d.prefill_p99_ms);
    let _ = writeln!(
        out,
        "  {:<18}{:>12}{:>12}   ({} of the incident's requests slower than the baseline P99)",
        "requests", d.requests.baseline, d.requests.window, d.requests_over_baseline_p99
    );
    let _ = writeln!(
        out,
        "  {:<18}{:>12}{:>12}",
        "window (s)",
        format!("{:.1}", d.baseline_window.duration_s()),
        format!("{:.1}", d.incident_window.duration_s())
    );
    let _ = writeln!(out);
    if d.regression {
        let phase = match d.dominant_phase {
            Phase::Queue => "queue wait (time before the engine admitted the request)",
            Phase::Prefill => "prefill (admission to first token)",
            Phase::None => "unknown (queue wait and prefill not measured)",
        };
        let _ = writeln!(out, "Grew most: {phase}");
        let _ = writeln!(
            out,
            "Cause:     {} - {} (confidence {:.2})",
            d.cause.as_str(),
            meaning(d.cause),
            d.confidence
        );
        if d.secondary_cause != Cause::None {
            let _ = writeln!(
                out,
                "Secondary: {} - {}",
                d.secondary_cause.as_str(),
                meaning(d.secondary_cause)
            );
        }
        if let Some(form) = d.traffic_form {
            let text = match form {
                LoadForm::Rate => "rate (more arrivals per second)",
                LoadForm::Concurrency => {
                    "concurrency (more requests in the system at once; arrivals capped by the service rate)"
                }
                LoadForm::RateAndConcurrency => "rate and concurrency",
            };
            let _ = writeln!(out, "Load form: {text}");
        }
        if !d.causes.is_empty() {
            let parts: Vec<String> = d
                .causes
                .iter()
                .map(|c| {
                    format!(
                        "{} {:.0}% (~{:.0} ms, x{:.2})",
                        c.cause.as_str(),
                        c.share * 100.0,
                        c.explains_ms,
                        c.factor
                    )
                })
                .collect();
            let rest = d
                .unexplained_share
                .filter(|u| *u > 0.0)
                .map_or(String::new(), |u| {
                    format!(", unexplained {:.0}%", u * 100.0)
                });
            let _ = writeln!(
                out,
                "Growth:    {}{rest} (of the queue-wait + prefill growth)",
                parts.join(", ")
            );
        }
    } else {
        let _ = writeln!(
            out,
            "Cause:     none - P99 TTFT did not regress (confidence {:.2})",
            d.confidence
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Evidence (baseline -> incident; [x] crossed its threshold, [ ] did not, [.] context only):"
    );
    evidence_lines(&mut out, &d.evidence);
    if d.preempted_count > 0 {
        let _ = writeln!(
            out,
            "Preempted in the incident window: {} request(s): {}",
            d.preempted_count,
            d.preempted_requests.join(", ")
        );
    }
    if !d.engine_config_changes.is_empty() {
        let parts: Vec<String> = d
            .engine_config_changes
            .iter()
            .map(|c| {
                format!(
                    "{} {} -> {}",
                    c.setting,
                    c.baseline.as_deref().unwrap_or("default"),
                    c.window.as_deref().unwrap_or("default")
                )
            })
            .collect();
        let _ = writeln!(out, "Engine config (command line): {}", parts.join(", "));
    }
    other_branches(&mut out, d);
    for n in &d.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    for m in &d.missing {
        let _ = writeln!(out, "Missing: {m}");
    }
    // Padded columns leave trailing spaces on rows without a ratio or rule.
    let mut trimmed: String = out
        .lines()
        .map(|l| l.trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    trimmed.push('\n');
    trimmed
}
