//! The Prometheus scrape endpoint: `GET /metrics`, in OpenMetrics when the scraper asks for it
//! (Prometheus does) and in the classic text format otherwise (curl, promtool, older scrapers).
use std::{collections::HashSet, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use inferscope_model::clock::monotonic_now_ns;
use tokio::net::TcpListener;

use super::{health::Health, metrics::Metrics};

pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/metrics`, and with `health` the kubelet's probes: `/healthz` (liveness: the
/// capture loop runs) and `/readyz` (readiness: it has made its first pass), 200 or 503.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Option<Arc<Health>>,
) -> std::io::Result<()> {
    let probe = |check: fn(&Health, u64) -> bool, health: Option<Arc<Health>>| {
        get(move || {
            let health = health.clone();
            async move {
                match health {
                    Some(h) if !check(&h, monotonic_now_ns()) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                    _ => (StatusCode::OK, "ok\n"),
                }
            }
        })
    };
    let app = Router::new()
        .route("/healthz", probe(Health::live, health.clone()))
        .route("/readyz", probe(Health::ready, health))
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let metrics = metrics.clone();
                async move {
                    let openmetrics = headers
                        .get(header::ACCEPT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.contains("application/openmetrics-text"));
                    match metrics.encode() {
                        Ok(body) if openmetrics => (
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        )
                            .into_response(),
                        Ok(body) => (
                            [(
                                header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )],
                            to_classic(&body),
                        )
                            .into_response(),
                        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed")
                            .into_response(),
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}

/// OpenMetrics → the classic text format: counters are declared under their `_total` sample
/// name, and the `# UNIT` and `# EOF` lines go (the classic format has neither).
pub(crate) fn to_classic(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let declared = line
            .strip_prefix("# HELP ")
            .map(|rest| ("# HELP ", rest))
            .or_else(|| line.strip_prefix("# TYPE ").map(|rest| ("# TYPE ", rest)));
        if let Some((prefix, rest)) = declared {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) {
                out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_format_names_counters_by_their_samples() {
        let om = "# HELP a_requests Finished.\n# TYPE a_requests counter\na_requests_total 3\n\
                  # HELP t Time.\n# TYPE t histogram\n# UNIT t seconds\nt_sum 1\n# EOF\n";
        let classic = to_classic(om);
        assert_eq!(
            classic,
            "# HELP a_requests_total Finished.\n# TYPE a_requests_total counter\na_requests_total 3\n\
             # HELP t Time.\n# TYPE t histogram\nt_sum 1\n"
        );
    }
}
