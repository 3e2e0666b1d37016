//! A bounded HTTP/1.1 GET for metrics endpoints over hyper's client (the same client as
//! identity/kube.rs): one connection per scrape (`Connection: close`), one deadline for connect,
//! send and receive, and a cap on the body (http-body-util's `Limited`). The engine's bytes are
//! parsed by hyper, never by hand here.
use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::{StatusCode, body::Body, header};
use hyper_util::rt::TokioIo;

#[derive(Debug, thiserror::Error)]
pub(crate) enum GetError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("no complete answer within the scrape timeout")]
    Timeout,
    #[error("connection failed: {0}")]
    Io(hyper::Error),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("malformed HTTP response: {0}")]
    BadResponse(String),
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
}

impl GetError {
    /// Counter name for this kind of failure.
    /// The agent counter this failure is counted in.
    pub(crate) fn counter(&self) -> inferscope_model::Counter {
        use inferscope_model::Counter;
        match self {
            GetError::Connect(_) => Counter::MetricsScrapeErrorsConnect,
            GetError::Timeout => Counter::MetricsScrapeErrorsTimeout,
            GetError::Io(_) => Counter::MetricsScrapeErrorsIo,
            GetError::Status(_) => Counter::MetricsScrapeErrorsHttpStatus,
            GetError::BadResponse(_) => Counter::MetricsScrapeErrorsBadResponse,
            GetError::TooLarge(_) => Counter::MetricsScrapeErrorsTooLarge,
        }
    }

    fn from_hyper(e: hyper::Error) -> Self {
        // A response hyper cannot parse, or one cut short of its declared framing, is the
        // engine's fault; anything else is the connection's.
        if e.is_parse()
            || e.is_parse_status()
            || e.is_incomplete_message()
            || e.is_parse_too_large()
        {
            GetError::BadResponse(e.to_string())
        } else {
            GetError::Io(e)
        }
    }

    /// An error while reading the body: hyper reports bad chunk framing and a close before the
    /// declared end as I/O errors of their own kinds.
    fn from_body(e: hyper::Error) -> Self {
        let framing = std::error::Error::source(&e)
            .and_then(|cause| cause.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::InvalidData
                        | std::io::ErrorKind::InvalidInput
                )
            });
        if framing {
            let cause = std::error::Error::source(&e).map(|c| c.to_string());
            GetError::BadResponse(format!("{e}: {}", cause.unwrap_or_default()))
        } else {
            GetError::from_hyper(e)
        }
    }
}

/// GETs `path` from `addr`; returns the body of a 200 response of at most `max_body` bytes.
pub(crate) async fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<Bytes, GetError> {
    tokio::time::timeout(timeout, exchange(addr, path, max_body))
        .await
        .unwrap_or(Err(GetError::Timeout))
}

async fn exchange(addr: SocketAddr, path: &str, max_body: usize) -> Result<Bytes, GetError> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(GetError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(GetError::from_hyper)?;
    // No Accept-Encoding: the body comes uncompressed. Accept text/plain: prometheus_client
    // would otherwise be free to answer in OpenMetrics.
    let request = hyper::Request::get(path)
        .header(header::HOST, addr.to_string())
        .header(header::USER_AGENT, "inferscope")
        .header(header::ACCEPT, "text/plain")
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| GetError::BadResponse(format!("cannot build the request: {e}")))?;
    let response = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(GetError::from_hyper)?;
        if response.status() != StatusCode::OK {
            return Err(GetError::Status(response.status().as_u16()));
        }
        if response
            .headers()
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Err(GetError::BadResponse("compressed body".into()));
        }
        let body = response.into_body();
        // A declared length over the cap fails before a byte of the body is read.
        if body.size_hint().lower() > max_body as u64 {
            return Err(GetError::TooLarge(max_body));
        }
        match Limited::new(body, max_body).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<LengthLimitError>() => Err(GetError::TooLarge(max_body)),
            Err(e) => match e.downcast::<hyper::Error>() {
                Ok(e) => Err(GetError::from_body(*e)),
                Err(e) => Err(GetError::BadResponse(e.to_string())),
            },
        }
    };
    // The connection future drives the socket; the response future reads what it delivers.
    // Whichever ends first, the body is complete only once the response future says so.
    tokio::pin!(connection, response);
    tokio::select! {
        body = &mut response => body,
        ended = &mut connection => match ended {
            Ok(()) => response.await,
            Err(e) => Err(GetError::from_hyper(e)),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead, Write},
        net::TcpListener,
        thread,
        time::Instant,
    };

    use super::*;

    /// Serves `response` to one connection after reading its request head.
    fn serve_once(response: &'static [u8], then_hold: bool) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 2 {
                line.clear();
            }
            let _ = conn.write_all(response);
            if then_hold {
                // Holds the connection open: the client must end on the framing or its deadline.
                thread::sleep(Duration::from_secs(3));
            }
        });
        addr
    }

    fn get_blocking(
        addr: SocketAddr,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Bytes, GetError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(get(addr, "/metrics", timeout, max_body))
    }

    const T: Duration = Duration::from_secs(2);

    #[test]
    fn reads_content_length_chunked_and_close_delimited_bodies() {
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\na 1\n", true);
        assert_eq!(&get_blocking(a, T, 1024).unwrap()[..], b"a 1\n");
        let a = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na 1\n\r\n4;x=y\r\nb 2\n\r\n0\r\n\r\n",
            true,
        );
        assert_eq!(&get_blocking(a, T, 1024).unwrap()[..], b"a 1\nb 2\n");
        let a = serve_once(b"HTTP/1.0 200 OK\r\n\r\nc 3\n", false);
        assert_eq!(&get_blocking(a, T, 1024).unwrap()[..], b"c 3\n");
    }

    #[test]
    fn failures_are_typed() {
        let a = serve_once(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert!(matches!(
            get_blocking(a, T, 1024),
            Err(GetError::Status(404))
        ));
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", false);
        assert!(matches!(
            get_blocking(a, T, 1024),
            Err(GetError::TooLarge(1024))
        ));
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", false);
        let got = get_blocking(a, T, 1024);
        assert!(matches!(got, Err(GetError::BadResponse(_))), "{got:?}");
        let a = serve_once(b"garbage\r\n\r\n", false);
        assert!(matches!(
            get_blocking(a, T, 1024),
            Err(GetError::BadResponse(_))
        ));
        let a = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nab",
            false,
        );
        assert!(matches!(
            get_blocking(a, T, 1024),
            Err(GetError::BadResponse(_))
        ));
        // Headers sent, body never: the deadline ends it.
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true);
        let t0 = Instant::now();
        assert!(matches!(
            get_blocking(a, Duration::from_millis(300), 1024),
            Err(GetError::Timeout)
        ));
        assert!(t0.elapsed() < Duration::from_secs(2));
        // Nobody listening.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(matches!(
            get_blocking(port, T, 1024),
            Err(GetError::Connect(_))
        ));
    }

    #[test]
    fn undeclared_bodies_are_cut_at_the_cap() {
        // No length announced: the cap is hit while reading, for chunks and for a close.
        let a = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
            true,
        );
        assert!(matches!(
            get_blocking(a, T, 20),
            Err(GetError::TooLarge(20))
        ));
        let a = serve_once(b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdef0123456789", false);
        assert!(matches!(
            get_blocking(a, T, 20),
            Err(GetError::TooLarge(20))
        ));
        // At the cap exactly is fine.
        let a = serve_once(b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefghij", false);
        assert_eq!(get_blocking(a, T, 20).unwrap().len(), 20);
    }

    #[test]
    fn malformed_chunks_are_bad_responses_not_panics() {
        for response in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\nab",
            b"HTTP/1.1 999999 Huh\r\n\r\n",
            b"\x00\xff\r\n\r\n",
        ] {
            let a = serve_once(response, false);
            let got = get_blocking(a, T, 1024);
            assert!(
                matches!(got, Err(GetError::BadResponse(_))),
                "{:?} -> {got:?}",
                String::from_utf8_lossy(response)
            );
        }
    }
}
