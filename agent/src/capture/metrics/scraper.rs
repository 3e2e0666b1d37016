//! The scraping thread: which engines to poll, on which port, and when.
use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use bytes::Bytes;
use inferscope_model::{Counter, clock::monotonic_now_ns, metric_names::MetricsEndpoint};
use tracing::{info, warn};

use super::http::{self, GetError};

#[derive(Debug, Clone, Copy)]
pub(crate) struct ScrapeConfig {
    pub interval: Duration,
    /// For the whole GET (connect, send, receive).
    pub timeout: Duration,
    pub max_body_bytes: usize,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            max_body_bytes: 8 << 20,
        }
    }
}

/// Engines polled at once; more are counted and skipped.
const MAX_TARGETS: usize = 256;
/// Listening ports tried per engine when looking for its metrics endpoint.
const MAX_PORTS_TRIED: usize = 8;
/// Scrapes waiting for the pipeline thread; more are dropped and counted.
const QUEUE: usize = 256;
/// Without a working endpoint, the ports are tried again after this many intervals.
const RETRY_INTERVALS: u32 = 5;

/// One successful scrape.
#[derive(Debug)]
pub(crate) struct Scrape {
    pub pid: u32,
    pub engine: &'static str,
    pub endpoint: &'static MetricsEndpoint,
    pub port: u16,
    pub start_mono_ns: u64,
    pub end_mono_ns: u64,
    pub body: Bytes,
    /// Failed scrapes of this engine since its previous successful one.
    pub failures_since_last: u64,
}

enum Command {
    Watch {
        pid: u32,
        engine: &'static str,
        endpoint: &'static MetricsEndpoint,
        ports: Vec<u16>,
    },
    Forget(u32),
}

/// The scraping thread's counters (it counts from its own thread, so atomics, not a [`inferscope_model::Stats`]).
const COUNTERS: [Counter; 10] = [
    Counter::MetricsScrapes,
    Counter::MetricsScrapeErrorsConnect,
    Counter::MetricsScrapeErrorsTimeout,
    Counter::MetricsScrapeErrorsIo,
    Counter::MetricsScrapeErrorsHttpStatus,
    Counter::MetricsScrapeErrorsBadResponse,
    Counter::MetricsScrapeErrorsTooLarge,
    Counter::MetricsScrapeErrorsNoEngineMetrics,
    Counter::MetricsScrapesDroppedQueueFull,
    Counter::MetricsTargetsOverLimit,
];

#[derive(Default)]
struct Counters([AtomicU64; COUNTERS.len()]);

impl Counters {
    fn bump(&self, counter: Counter) {
        if let Some(i) = COUNTERS.iter().position(|c| *c == counter) {
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Handle to the scraping thread; dropping it stops the thread.
pub(crate) struct MetricsScraper {
    commands: Option<SyncSender<Command>>,
    scrapes: Receiver<Scrape>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    /// Watch/forget commands lost because the thread was behind (it reads them every interval).
    commands_dropped: u64,
}

impl MetricsScraper {
    pub(crate) fn start(config: ScrapeConfig) -> std::io::Result<Self> {
        let (cmd_tx, cmd_rx) = mpsc::sync_channel(1024);
        let (scrape_tx, scrape_rx) = mpsc::sync_channel(QUEUE);
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        // The GETs are hyper's (async); this thread drives them one at a time on its own
        // single-threaded runtime, so a slow engine delays only the scrapes behind it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("metrics-scraper".into())
            .spawn(move || run(config, &runtime, cmd_rx, scrape_tx, &thread_counters))?;
        Ok(Self {
            commands: Some(cmd_tx),
            scrapes: scrape_rx,
            counters,
            thread: Some(thread),
            commands_dropped: 0,
        })
    }

    /// Starts (or, with new ports, updates) polling of an engine process.
    pub(crate) fn watch(
        &mut self,
        pid: u32,
        engine: &'static str,
        endpoint: &'static MetricsEndpoint,
        ports: &[u16],
    ) {
        self.send(Command::Watch {
            pid,
            engine,
            endpoint,
            ports: ports.iter().copied().take(MAX_PORTS_TRIED).collect(),
        });
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.send(Command::Forget(pid));
    }

    fn send(&mut self, command: Command) {
        if let Some(tx) = &self.commands
            && tx.try_send(command).is_err()
        {
            self.commands_dropped += 1;
        }
    }

    /// A finished scrape, if one is waiting.
    pub(crate) fn try_next(&self) -> Option<Scrape> {
        self.scrapes.try_recv().ok()
    }

    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        let mut all: Vec<(Counter, u64)> = COUNTERS
            .iter()
            .zip(&self.counters.0)
            .map(|(c, v)| (*c, v.load(Ordering::Relaxed)))
            .collect();
        all.push((Counter::MetricsCommandsDropped, self.commands_dropped));
        all
    }
}

impl Drop for MetricsScraper {
    fn drop(&mut self) {
        // Closing the command channel ends the thread at its next wake-up (within an interval
        // plus one scrape timeout).
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Target {
    engine: &'static str,
    endpoint: &'static MetricsEndpoint,
    ports: Vec<u16>,
    /// The port whose endpoint answered last; None while searching.
    port: Option<u16>,
    due: Instant,
    failures: u64,
    warned: bool,
}

fn run(
    config: ScrapeConfig,
    runtime: &tokio::runtime::Runtime,
    commands: Receiver<Command>,
    out: SyncSender<Scrape>,
    counters: &Counters,
) {
    let mut targets: HashMap<u32, Target> = HashMap::new();
    loop {
        let now = Instant::now();
        let next_due = targets.values().map(|t| t.due).min();
        let wait = next_due.map_or(config.interval, |d| d.saturating_duration_since(now));
        match commands.recv_timeout(wait) {
            Ok(command) => {
                apply(command, &mut targets, counters);
                // Drain whatever else queued up, then scrape what is due.
                while let Ok(command) = commands.try_recv() {
                    apply(command, &mut targets, counters);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let due: Vec<u32> = targets
            .iter()
            .filter(|(_, t)| t.due <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            let Some(target) = targets.get_mut(&pid) else {
                continue;
            };
            scrape_target(pid, target, &config, runtime, &out, counters);
        }
    }
}

fn apply(command: Command, targets: &mut HashMap<u32, Target>, counters: &Counters) {
    match command {
        Command::Watch {
            pid,
            engine,
            endpoint,
            ports,
        } => {
            if let Some(t) = targets.get_mut(&pid) {
                if t.port.is_some_and(|p| !ports.contains(&p)) {
                    t.port = None;
                }
                t.ports = ports;
                t.due = Instant::now();
                return;
            }
            if targets.len() >= MAX_TARGETS {
                counters.bump(Counter::MetricsTargetsOverLimit);
                return;
            }
            targets.insert(
                pid,
                Target {
                    engine,
                    endpoint,
                    ports,
                    port: None,
                    due: Instant::now(),
                    failures: 0,
                    warned: false,
                },
            );
        }
        Command::Forget(pid) => {
            targets.remove(&pid);
        }
    }
}

fn scrape_target(
    pid: u32,
    t: &mut Target,
    config: &ScrapeConfig,
    runtime: &tokio::runtime::Runtime,
    out: &SyncSender<Scrape>,
    counters: &Counters,
) {
    // Known port first; else every listening port, until one serves this engine's metrics.
    let candidates: Vec<u16> = match t.port {
        Some(p) => vec![p],
        None => t.ports.clone(),
    };
    let mut last_error: Option<GetError> = None;
    for port in candidates {
        let start_mono_ns = monotonic_now_ns();
        match runtime.block_on(get_local(port, t.endpoint.path, config)) {
            Ok(body) if serves_engine_metrics(&body, t.endpoint) => {
                let end_mono_ns = monotonic_now_ns();
                counters.bump(Counter::MetricsScrapes);
                if t.port.is_none() {
                    info!(
                        pid,
                        engine = t.engine,
                        port,
                        path = t.endpoint.path,
                        "scraping engine metrics"
                    );
                }
                t.port = Some(port);
                t.due = Instant::now() + config.interval;
                let scrape = Scrape {
                    pid,
                    engine: t.engine,
                    endpoint: t.endpoint,
                    port,
                    start_mono_ns,
                    end_mono_ns,
                    body,
                    failures_since_last: std::mem::take(&mut t.failures),
                };
                match out.try_send(scrape) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        counters.bump(Counter::MetricsScrapesDroppedQueueFull)
                    }
                    // The pipeline is gone; the command channel closes next.
                    Err(TrySendError::Disconnected(_)) => {}
                }
                return;
            }
            Ok(_) => {
                counters.bump(Counter::MetricsScrapeErrorsNoEngineMetrics);
                last_error = None;
            }
            Err(e) => {
                counters.bump(e.counter());
                last_error = Some(e);
            }
        }
    }
    t.failures += 1;
    let retry = if t.port.is_some() {
        // The endpoint answered before: try it again at the normal pace, then search anew.
        t.port = None;
        config.interval
    } else {
        config.interval * RETRY_INTERVALS
    };
    t.due = Instant::now() + retry;
    if !t.warned {
        t.warned = true;
        let why = last_error.map_or_else(
            || "answers without this engine's metrics".to_string(),
            |e| e.to_string(),
        );
        warn!(
            pid,
            engine = t.engine,
            ports = ?t.ports,
            path = t.endpoint.path,
            "engine metrics unavailable ({why}); {}",
            t.endpoint.enable_hint
        );
    }
}

/// The engine's port on loopback: IPv4 first, then IPv6. An engine bound only to a non-loopback
/// address is not reachable this way (the warning says so through the connect error).
async fn get_local(port: u16, path: &str, config: &ScrapeConfig) -> Result<Bytes, GetError> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match http::get(v4, path, config.timeout, config.max_body_bytes).await {
        Err(GetError::Connect(_)) => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            http::get(v6, path, config.timeout, config.max_body_bytes).await
        }
        other => other,
    }
}

/// Whether a 200 answer is this engine's exposition (not some other /metrics on another port):
/// it names at least one metric of the engine's table.
fn serves_engine_metrics(body: &[u8], endpoint: &MetricsEndpoint) -> bool {
    endpoint
        .sources
        .iter()
        .any(|s| memchr::memmem::find(body, s.metric.as_bytes()).is_some())
}

impl inferscope_model::PerProcess for MetricsScraper {
    fn process_gone(&mut self, tgid: u32) {
        self.forget(tgid);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead, Write},
        net::TcpListener,
    };

    use super::*;
    use crate::engines::by_name;

    /// A stand-in metrics server that answers every GET with `body` (a real exposition from
    /// the fixtures) and counts the requests.
    fn serve(body: &'static [u8], hits: Arc<AtomicU64>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                hits.fetch_add(1, Ordering::Relaxed);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(body);
            }
        });
        port
    }

    #[test]
    fn finds_the_port_that_serves_the_engine_and_polls_it() {
        let hits = Arc::new(AtomicU64::new(0));
        let other = Arc::new(AtomicU64::new(0));
        // A port serving someone else's metrics, one serving nothing, and the engine's.
        let foreign = serve(b"go_goroutines 12\n", other.clone());
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let engine = serve(
            include_bytes!("../../../../tests/fixtures/metrics/llamacpp.txt"),
            hits.clone(),
        );
        let endpoint = by_name("llamacpp").and_then(|e| e.metrics()).unwrap();
        let mut scraper = MetricsScraper::start(ScrapeConfig {
            interval: Duration::from_millis(100),
            ..Default::default()
        })
        .unwrap();
        scraper.watch(42, "llamacpp", endpoint, &[foreign, closed, engine]);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 3 && Instant::now() < deadline {
            match scraper.try_next() {
                Some(s) => got.push(s),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|s| s.port == engine && s.pid == 42));
        assert!(got[0].body.starts_with(b"# HELP llamacpp:"));
        assert!(got[1].start_mono_ns >= got[0].end_mono_ns);
        // The foreign port was tried once, during the search, and not polled afterwards.
        assert_eq!(other.load(Ordering::Relaxed), 1);
        let counters: HashMap<Counter, u64> = scraper.counters().into_iter().collect();
        assert_eq!(counters[&Counter::MetricsScrapeErrorsNoEngineMetrics], 1);
        assert!(counters[&Counter::MetricsScrapeErrorsConnect] >= 1);
        scraper.forget(42);
        std::thread::sleep(Duration::from_millis(300));
        while scraper.try_next().is_some() {}
        let before = hits.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(hits.load(Ordering::Relaxed), before, "polled after forget");
    }
}
