//! The fleet diagnosis's source: instant queries to a Prometheus HTTP API (`/api/v1/query`),
//! one connection per query, over plain HTTP (put a TLS-terminating proxy or port-forward in
//! front of a Prometheus that needs TLS).
use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use crate::diagnose::fleet::{Query, QueryError, Sample};

/// Largest answer read: a vector of one value per replica is a few KiB; this bounds a
/// misconfigured query that returns every raw series.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

pub(super) struct Prometheus {
    host: String,
    port: u16,
    /// A path prefix (Prometheus behind `--web.route-prefix` or a proxy path).
    prefix: String,
    url: String,
    runtime: tokio::runtime::Runtime,
}

impl Prometheus {
    pub(super) fn new(url: &str) -> anyhow::Result<Prometheus> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            anyhow::anyhow!(
                "--prometheus {url}: only http:// URLs are read (port-forward or proxy a TLS Prometheus)"
            )
        })?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse()
                    .map_err(|_| anyhow::anyhow!("--prometheus {url}: bad port {p}"))?,
            ),
            None => (authority.to_owned(), 80),
        };
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("/{}", path.trim_end_matches('/'))
        };
        Ok(Prometheus {
            host,
            port,
            prefix,
            url: url.to_owned(),
            runtime: super::client::runtime()?,
        })
    }

    async fn get(&self, path: &str) -> Result<(u16, Bytes), String> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port))
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, "inferscope")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

impl Query for Prometheus {
    fn instant(&self, promql: &str, at_unix_s: f64) -> Result<Vec<Sample>, QueryError> {
        let path = format!(
            "{}/api/v1/query?query={}&time={at_unix_s:.3}",
            self.prefix,
            encode(promql)
        );
        let (status, body) =
            self.runtime
                .block_on(self.get(&path))
                .map_err(|why| QueryError::Unreachable {
                    url: self.url.clone(),
                    why,
                })?;
        let answer: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| QueryError::Malformed(format!("HTTP {status}: {e}")))?;
        if answer["status"] != "success" {
            return Err(QueryError::Refused {
                query: promql.to_owned(),
                why: answer["error"]
                    .as_str()
                    .unwrap_or("no reason given")
                    .to_owned(),
            });
        }
        parse_vector(&answer["data"])
    }
}

/// An instant query's `data`: a vector (or a scalar) of `[time, "value"]` pairs.
fn parse_vector(data: &serde_json::Value) -> Result<Vec<Sample>, QueryError> {
    let value = |v: &serde_json::Value| {
        v.get(1)
            .and_then(|s| s.as_str())
            .and_then(|s| s.parse::<f64>().ok())
    };
    match data["resultType"].as_str() {
        Some("vector") => Ok(data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let labels: BTreeMap<String, String> = r["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
                Some(Sample {
                    labels,
                    value: value(&r["value"])?,
                })
            })
            .collect()),
        Some("scalar") => Ok(value(&data["result"])
            .map(|value| Sample {
                labels: BTreeMap::new(),
                value,
            })
            .into_iter()
            .collect()),
        other => Err(QueryError::Malformed(format!(
            "an instant query answered with {other:?}"
        ))),
    }
}

/// Percent-encodes a query parameter (RFC 3986: all but the unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_into_samples() {
        let data = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"instance": "a:9464"}, "value": [1.0, "0.25"]},
            {"metric": {"instance": "b:9464"}, "value": [1.0, "NaN"]},
            {"metric": {}, "value": [1.0, "oops"]},
        ]});
        let v = parse_vector(&data).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].labels["instance"], "a:9464");
        assert!(v[1].value.is_nan());
        let scalar = serde_json::json!({"resultType": "scalar", "result": [1.0, "3"]});
        assert_eq!(parse_vector(&scalar).unwrap()[0].value, 3.0);
        assert!(parse_vector(&serde_json::json!({"resultType": "matrix"})).is_err());
        assert_eq!(
            encode("sum by (le) (x{a=\"b\"}[5s])"),
            "sum%20by%20%28le%29%20%28x%7Ba%3D%22b%22%7D%5B5s%5D%29"
        );
    }
}
