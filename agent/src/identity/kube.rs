//! A minimal Kubernetes API client for one job: list and watch the pods of this node
//! (`fieldSelector=spec.nodeName=NODE`) into a [`PodStore`]. It runs on the agent's async
//! runtime and never holds up the pipeline: a down, slow or garbled API only leaves the cache
//! stale or empty, with every failure counted, and the watcher retries with backoff.
//!
//! Two GETs on plain HTTP/1.1 (hyper) over TLS (rustls, the service account's CA and token);
//! kube-rs would bring k8s-openapi's whole API surface to read six fields of a Pod.
use std::{
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, info, warn};

use super::pods::{Pod, PodStore};

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// A list of one node's pods is a few MB at most; beyond this the answer is not the API's.
const MAX_LIST_BYTES: usize = 64 << 20;
/// One watch event is one pod object.
const MAX_EVENT_BYTES: usize = 4 << 20;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub(crate) struct KubeConfig {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Re-read before every request: projected service account tokens rotate.
    pub token_path: Option<PathBuf>,
    pub ca_path: Option<PathBuf>,
    pub node_name: String,
    /// A list (or the start of a watch) that takes longer fails and is retried.
    pub request_timeout: Duration,
    /// Asked of the API server per watch (it then ends the watch; the agent resumes it).
    pub watch_seconds: u64,
    /// The first wait after a failure; it doubles per failure up to 30 s.
    pub backoff: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("connecting to the Kubernetes API at {0} failed: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with the Kubernetes API failed: {0}")]
    Tls(String),
    #[error("HTTP with the Kubernetes API failed: {0}")]
    Http(#[from] hyper::Error),
    #[error(
        "the Kubernetes API answered {0} (the agent's service account needs get/list/watch on pods)"
    )]
    Status(u16),
    #[error("the Kubernetes API did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the Kubernetes API's answer is not a pod list: {0}")]
    Garbage(String),
}

impl KubeConfig {
    /// Inside a pod: the API from KUBERNETES_SERVICE_HOST/PORT, the service account's token and
    /// CA, the node from NODE_NAME (the DaemonSet sets it from spec.nodeName).
    /// INFERSCOPE_KUBE_API=http(s)://host:port points elsewhere (`kubectl proxy`, tests).
    /// `None` outside Kubernetes: the agent then names processes by container id and pid.
    pub(crate) fn from_env() -> Option<KubeConfig> {
        let node_name = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty())?;
        let sa = PathBuf::from(SERVICE_ACCOUNT);
        let existing = |name: &str| Some(sa.join(name)).filter(|p| p.exists());
        let (tls, host, port) = if let Ok(url) = std::env::var("INFERSCOPE_KUBE_API") {
            parse_url(&url)?
        } else {
            let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
            let port = std::env::var("KUBERNETES_SERVICE_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(443);
            (true, host, port)
        };
        Some(KubeConfig {
            tls,
            host,
            port,
            token_path: existing("token"),
            ca_path: existing("ca.crt"),
            node_name,
            request_timeout: Duration::from_secs(10),
            watch_seconds: 290,
            backoff: Duration::from_millis(500),
        })
    }

    fn pods_path(&self, extra: &str) -> String {
        format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{}{extra}",
            percent_encode(&self.node_name)
        )
    }
}

fn parse_url(url: &str) -> Option<(bool, String, u16)> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        (false, url.strip_prefix("http://")?)
    };
    let authority = rest.split('/').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().ok()?),
        None => (authority.to_string(), if tls { 443 } else { 80 }),
    };
    Some((tls, host.trim_matches(['[', ']']).to_string(), port))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Starts the watcher on `runtime`; returns the store the pipeline reads.
pub(crate) fn start(config: KubeConfig, runtime: &tokio::runtime::Handle) -> Arc<PodStore> {
    let store = Arc::new(PodStore::default());
    info!(
        node = config.node_name,
        api = format!("{}:{}", config.host, config.port),
        "watching this node's pods in the Kubernetes API for pod identity"
    );
    runtime.spawn(watch_pods(config, store.clone()));
    store
}

/// List, then watch from the list's resourceVersion; on any failure count it, wait, re-list.
pub(crate) async fn watch_pods(config: KubeConfig, store: Arc<PodStore>) {
    let mut backoff = config.backoff;
    let mut failing = false;
    loop {
        let result = async {
            let mut version = list(&config, &store).await?;
            if failing {
                info!("the Kubernetes API answers again; pod identity resumes");
                failing = false;
            }
            backoff = config.backoff;
            loop {
                match watch(&config, &store, &mut version).await? {
                    WatchEnd::Closed => continue,
                    WatchEnd::Expired => return Ok::<(), KubeError>(()),
                }
            }
        }
        .await;
        if let Err(e) = result {
            let counter = match e {
                KubeError::Garbage(_) => &store.counters.garbage,
                _ => &store.counters.api_errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if !failing {
                warn!(
                    "{e}; records keep flowing with container ids only until it answers (retrying)"
                );
                failing = true;
            } else {
                debug!("{e}");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

enum WatchEnd {
    /// The server ended the watch (its timeout): resume from the last version.
    Closed,
    /// 410 Gone: the version is too old; re-list.
    Expired,
}

async fn list(config: &KubeConfig, store: &PodStore) -> Result<String, KubeError> {
    let path = config.pods_path("&limit=0");
    let body = tokio::time::timeout(config.request_timeout, async {
        let response = get(config, &path).await?;
        let limited = http_body_util::Limited::new(response.into_body(), MAX_LIST_BYTES);
        limited
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| KubeError::Garbage(format!("reading the pod list: {e}")))
    })
    .await
    .map_err(|_| KubeError::Timeout(config.request_timeout))??;
    let list: Value = serde_json::from_slice(&body)
        .map_err(|e| KubeError::Garbage(format!("pod list is not JSON: {e}")))?;
    let items = list
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| KubeError::Garbage("pod list without items".into()))?;
    let version = list
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .ok_or_else(|| KubeError::Garbage("pod list without resourceVersion".into()))?
        .to_string();
    let mut pods = Vec::with_capacity(items.len());
    for item in items {
        match Pod::from_json(item) {
            Some(pod) => pods.push(pod),
            None => {
                store.counters.garbage.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    debug!(pods = pods.len(), version, "listed this node's pods");
    store.replace(pods);
    Ok(version)
}

async fn watch(
    config: &KubeConfig,
    store: &PodStore,
    version: &mut String,
) -> Result<WatchEnd, KubeError> {
    let path = config.pods_path(&format!(
        "&watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
        config.watch_seconds,
        percent_encode(version)
    ));
    let response = tokio::time::timeout(config.request_timeout, get(config, &path))
        .await
        .map_err(|_| KubeError::Timeout(config.request_timeout))??;
    let mut body = response.into_body();
    let mut line: Vec<u8> = Vec::new();
    // No event, not even a bookmark, for this long: the connection is dead.
    let idle = Duration::from_secs(config.watch_seconds + 30);
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(KubeError::Timeout(idle)),
            Ok(None) => return Ok(WatchEnd::Closed),
            Ok(Some(frame)) => frame?,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for chunk in data.split_inclusive(|b| *b == b'\n') {
            if line.len() + chunk.len() > MAX_EVENT_BYTES {
                return Err(KubeError::Garbage("a watch event over 4 MiB".into()));
            }
            line.extend_from_slice(chunk);
            if line.ends_with(b"\n") {
                let end = apply_event(store, &line, version)?;
                line.clear();
                if let Some(end) = end {
                    return Ok(end);
                }
            }
        }
    }
}

/// Applies one watch line to `store` (for the fuzz target): whether it ends the watch.
pub fn apply_watch_line(
    store: &PodStore,
    line: &[u8],
    version: &mut String,
) -> Result<bool, KubeError> {
    apply_event(store, line, version).map(|end| end.is_some())
}

/// One watch line: `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": {...}}`.
fn apply_event(
    store: &PodStore,
    line: &[u8],
    version: &mut String,
) -> Result<Option<WatchEnd>, KubeError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let event: Value = serde_json::from_slice(line)
        .map_err(|e| KubeError::Garbage(format!("watch event is not JSON: {e}")))?;
    let object = event.get("object").unwrap_or(&Value::Null);
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
    if kind == "ERROR" {
        // A Status object; 410 Gone means the version was compacted away.
        if object.get("code").and_then(Value::as_u64) == Some(410) {
            store.counters.watch_expired.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(WatchEnd::Expired));
        }
        return Err(KubeError::Garbage(format!("watch error: {object}")));
    }
    if let Some(v) = object
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
    {
        v.clone_into(version);
    }
    store.counters.watch_events.fetch_add(1, Ordering::Relaxed);
    match kind {
        "BOOKMARK" => {}
        "ADDED" | "MODIFIED" => match Pod::from_json(object) {
            Some(pod) => store.upsert(pod),
            None => {
                store.counters.garbage.fetch_add(1, Ordering::Relaxed);
            }
        },
        "DELETED" => match object
            .get("metadata")
            .and_then(|m| m.get("uid"))
            .and_then(Value::as_str)
        {
            Some(uid) => store.remove(uid),
            None => {
                store.counters.garbage.fetch_add(1, Ordering::Relaxed);
            }
        },
        _ => {
            store.counters.garbage.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(None)
}

async fn get(
    config: &KubeConfig,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>, KubeError> {
    let address = format!("{}:{}", config.host, config.port);
    let tcp = tokio::net::TcpStream::connect((config.host.as_str(), config.port))
        .await
        .map_err(|e| KubeError::Connect(address.clone(), e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = if config.tls {
        Box::new(tls_connect(config, tcp).await?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!("Kubernetes API connection ended: {e}");
        }
    });
    let mut request = hyper::Request::get(path)
        .header(hyper::header::HOST, address)
        .header(hyper::header::ACCEPT, "application/json")
        .header(hyper::header::USER_AGENT, "inferscope");
    if let Some(token) = config
        .token_path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        request = request.header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.trim()),
        );
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| KubeError::Garbage(format!("building the request: {e}")))?;
    let response = sender.send_request(request).await?;
    if !response.status().is_success() {
        return Err(KubeError::Status(response.status().as_u16()));
    }
    Ok(response)
}

async fn tls_connect(
    config: &KubeConfig,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, KubeError> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &config.ca_path {
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| KubeError::Tls(format!("reading {}: {e}", ca.display())))?;
        for cert in certs.flatten() {
            let _ = roots.add(cert);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(config.host.clone())
        .map_err(|e| KubeError::Tls(format!("{}: {e}", config.host)))?;
    tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .map_err(|e| KubeError::Tls(e.to_string()))
}

#[cfg(test)]
mod tests;
