//! `inferscope top`: a live terminal view of a running agent — requests as they finish, P50/P99
//! of TTFT, queue wait, prefill and TPOT over a sliding window, and per-GPU gauges.
use std::{
    collections::{BTreeMap, VecDeque},
    fmt::Write as _,
    io::{IsTerminal, Write as _},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Args;
use crossterm::{cursor, execute, terminal};
use inferscope_model::quantile::percentile;
use inferscope_proto::v1::agent::{
    GpuSample, ListRequestsRequest, Request, SubscribeRequest, event::Record,
};

use super::{
    client::{ConnectArgs, runtime},
    shutdown,
};

/// Requests kept for the percentiles, whatever the window.
const MAX_WINDOW_REQUESTS: usize = 100_000;

#[derive(Args, Debug)]
pub(super) struct TopArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Percentiles over requests that finished this recently.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Redraw this often.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print this many snapshots, then exit (default: until Ctrl-C). Without a terminal, each
    /// snapshot is printed below the previous one.
    #[arg(long)]
    pub iterations: Option<u64>,
    /// Only this engine.
    #[arg(long)]
    pub engine: Option<String>,
}

#[derive(Default)]
struct View {
    requests: VecDeque<(Instant, Request)>,
    gpus: BTreeMap<u32, GpuSample>,
    lagged: u64,
    seen: u64,
}

impl View {
    fn add(&mut self, now: Instant, r: Request, window: Duration) {
        self.seen += 1;
        self.requests.push_back((now, r));
        while self.requests.len() > MAX_WINDOW_REQUESTS
            || self
                .requests
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > window)
        {
            self.requests.pop_front();
        }
    }

    fn render(&self, window: Duration) -> String {
        let mut out = String::new();
        let n = self.requests.len();
        let rate = n as f64 / window.as_secs_f64();
        let _ = writeln!(
            out,
            "inferscope top — {n} requests in the last {} ({rate:.2}/s), {} seen{}",
            humantime::format_duration(window),
            self.seen,
            if self.lagged > 0 {
                format!(", {} missed (slow terminal)", self.lagged)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "\n{:<12}{:>10}{:>10}{:>10}",
            "", "P50 ms", "P99 ms", "n"
        );
        type Field = fn(&Request) -> Option<f64>;
        let fields: [(&str, Field); 5] = [
            ("TTFT", |r| r.ttft_ms),
            ("queue wait", |r| r.queue_wait_ms),
            ("prefill", |r| r.prefill_ms),
            ("TPOT", |r| r.tpot_ms),
            ("E2E", |r| Some(r.e2e_ms)),
        ];
        for (name, get) in fields {
            let mut v: Vec<f64> = self.requests.iter().filter_map(|(_, r)| get(r)).collect();
            v.sort_by(f64::total_cmp);
            let p = |q| percentile(&v, q).map_or("-".to_string(), |x| format!("{x:.1}"));
            let _ = writeln!(
                out,
                "{:<12}{:>10}{:>10}{:>10}",
                name,
                p(0.5),
                p(0.99),
                v.len()
            );
        }
        if !self.gpus.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<5}{:<24}{:>7}{:>8}{:>8}{:>9}{:>8}  flags",
                "GPU", "name", "util%", "tensor%", "dram%", "mem GiB", "power W"
            );
            for g in self.gpus.values() {
                let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
                let _ = writeln!(
                    out,
                    "{:<5}{:<24}{:>7}{:>8}{:>8}{:>9}{:>8}  {}",
                    g.index,
                    g.name.chars().take(23).collect::<String>(),
                    f(g.gpu_util_pct),
                    f(g.tensor_util_pct),
                    f(g.dram_bw_util_pct),
                    g.memory_used_bytes.map_or("-".into(), |b| format!(
                        "{:.1}",
                        b as f64 / (1u64 << 30) as f64
                    )),
                    f(g.power_w),
                    if g.outliers.is_empty() {
                        String::new()
                    } else {
                        format!("OUTLIER: {}", g.outliers.join(","))
                    }
                );
            }
        }
        let _ = writeln!(
            out,
            "\n{:<22}{:<10}{:>6}{:>10}{:>10}{:>10}{:>8}{:>8}",
            "latest requests", "engine", "status", "TTFT", "queue", "prefill", "in tok", "out tok"
        );
        for (_, r) in self.requests.iter().rev().take(15) {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
            let t = |v: Option<u64>| v.map_or("-".to_string(), |x| x.to_string());
            let id = if r.x_request_id.is_empty() {
                &r.request_id
            } else {
                &r.x_request_id
            };
            let _ = writeln!(
                out,
                "{:<22}{:<10}{:>6}{:>10}{:>10}{:>10}{:>8}{:>8}",
                id.chars().take(21).collect::<String>(),
                r.engine.chars().take(9).collect::<String>(),
                r.status,
                f(r.ttft_ms),
                f(r.queue_wait_ms),
                f(r.prefill_ms),
                t(r.prompt_tokens),
                t(r.completion_tokens)
            );
        }
        out
    }
}

pub(super) fn run(args: TopArgs) -> anyhow::Result<()> {
    shutdown::install();
    let tty = std::io::stdout().is_terminal();
    runtime()?.block_on(async {
        let mut client = args.connect.client().await?;
        let mut stream = client
            .subscribe(SubscribeRequest {
                engine: args.engine.clone().unwrap_or_default(),
                requests: true,
                gpus: true,
                ..Default::default()
            })
            .await
            .context("subscribing to the agent failed")?
            .into_inner();
        let mut view = View::default();
        // Requests that finished within the window before we subscribed: the first snapshot
        // shows what the agent holds, not only what finishes from now on.
        let now_mono = inferscope_model::clock::monotonic_now_ns();
        let window_ns = u64::try_from(args.window.as_nanos()).unwrap_or(u64::MAX);
        let mut recent = client
            .list_requests(ListRequestsRequest {
                limit: 10_000,
                engine: args.engine.clone().unwrap_or_default(),
                since_mono_ns: now_mono.saturating_sub(window_ns),
                ..Default::default()
            })
            .await
            .context("listing the agent's recent requests failed")?
            .into_inner()
            .requests;
        recent.sort_by_key(|r| r.end_mono_ns);
        let now = Instant::now();
        for r in recent {
            let age = Duration::from_nanos(now_mono.saturating_sub(r.end_mono_ns));
            view.add(now.checked_sub(age).unwrap_or(now), r, args.window);
        }
        let mut ticker = tokio::time::interval(args.interval);
        ticker.tick().await;
        let mut printed = 0u64;
        let mut stdout = std::io::stdout();
        if tty {
            execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide)?;
        }
        let result: anyhow::Result<()> = loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(event)) => {
                        view.lagged += event.lagged;
                        match event.record {
                            Some(Record::Request(r)) => view.add(Instant::now(), r, args.window),
                            Some(Record::Gpu(g)) => { view.gpus.insert(g.index, g); }
                            _ => {}
                        }
                    }
                    Ok(None) => break Err(anyhow::anyhow!("the agent closed the stream")),
                    Err(s) => break Err(anyhow::anyhow!("the agent stream failed: {}", s.message())),
                },
                _ = ticker.tick() => {
                    let text = view.render(args.window);
                    if tty {
                        execute!(stdout, cursor::MoveTo(0, 0), terminal::Clear(terminal::ClearType::All))?;
                        print!("{}", text.replace('\n', "\r\n"));
                    } else {
                        println!("{text}");
                    }
                    stdout.flush()?;
                    printed += 1;
                    if args.iterations.is_some_and(|n| printed >= n)
                        || shutdown::STOP.load(std::sync::atomic::Ordering::Relaxed)
                    {
                        break Ok(());
                    }
                }
            }
        };
        if tty {
            execute!(stdout, cursor::Show, terminal::LeaveAlternateScreen)?;
        }
        result
    })
}
