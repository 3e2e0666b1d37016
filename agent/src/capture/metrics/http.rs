//! A bounded HTTP/1.1 GET for metrics endpoints: one connection per scrape (`Connection: close`),
//! one deadline for connect, send and receive, and a cap on the bytes read.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("no complete answer within the scrape timeout")]
    Timeout,
    #[error("connection failed: {0}")]
    Io(std::io::Error),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("malformed HTTP response: {0}")]
    BadResponse(&'static str),
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
}

impl GetError {
    /// Counter name for this kind of failure.
    pub fn as_str(&self) -> &'static str {
        match self {
            GetError::Connect(_) => "connect",
            GetError::Timeout => "timeout",
            GetError::Io(_) => "io",
            GetError::Status(_) => "http_status",
            GetError::BadResponse(_) => "bad_response",
            GetError::TooLarge(_) => "too_large",
        }
    }
}

const MAX_HEAD: usize = 16 << 10;

/// GETs `path` from `addr`; returns the body of a 200 response.
pub fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<Vec<u8>, GetError> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut => GetError::Timeout,
        _ => GetError::Connect(e),
    })?;
    let _ = stream.set_nodelay(true);
    let remaining = |deadline: Instant| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(GetError::Timeout)
    };
    stream
        .set_write_timeout(Some(remaining(deadline)?))
        .map_err(GetError::Io)?;
    // No Accept-Encoding: the body comes uncompressed. Accept text/plain: prometheus_client
    // would otherwise be free to answer in OpenMetrics.
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: inferscope\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(io_or_timeout)?;
    let limit = MAX_HEAD + max_body;
    let mut buf = Vec::with_capacity(16 << 10);
    let mut chunk = [0u8; 16 << 10];
    loop {
        stream
            .set_read_timeout(Some(remaining(deadline)?))
            .map_err(GetError::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_or_timeout(e)),
        };
        if n == 0 {
            break;
        }
        if buf.len() + n > limit {
            return Err(GetError::TooLarge(max_body));
        }
        buf.extend_from_slice(&chunk[..n]);
        // A server may keep the connection open despite `Connection: close`: stop as soon as
        // the framing says the body is complete. A chunked body is only walked once its last
        // chunk may be in, so a large one is not re-read on every read.
        if (!is_chunked(&buf) || buf.ends_with(b"0\r\n\r\n"))
            && let Some(body) = parse_response(&buf, max_body, false)?
        {
            return Ok(body);
        }
    }
    parse_response(&buf, max_body, true)?.ok_or(GetError::BadResponse("empty response"))
}

/// The body of a 200 response held in `buf` (bytes from the engine, untrusted): Some once the
/// framing says it is whole, or, at `eof`, when the connection's close delimits it; None while
/// more is expected.
pub fn parse_response(buf: &[u8], max_body: usize, eof: bool) -> Result<Option<Vec<u8>>, GetError> {
    match complete_body(buf, max_body)? {
        Some(body) => Ok(Some(body)),
        None if eof => until_close(buf, max_body).map(Some),
        None => Ok(None),
    }
}

fn io_or_timeout(e: std::io::Error) -> GetError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => GetError::Timeout,
        _ => GetError::Io(e),
    }
}

fn is_chunked(buf: &[u8]) -> bool {
    matches!(head(buf), Ok(Some(h)) if h.chunked)
}

struct Head {
    len: usize,
    chunked: bool,
    content_length: Option<usize>,
}

fn head(buf: &[u8]) -> Result<Option<Head>, GetError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(GetError::BadResponse("header too long"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(GetError::BadResponse("not an HTTP/1.x response")),
    };
    let code = response.code.unwrap_or(0);
    if code != 200 {
        return Err(GetError::Status(code));
    }
    let mut chunked = false;
    let mut content_length = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        } else if h.name.eq_ignore_ascii_case("content-length") {
            content_length = Some(
                std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or(GetError::BadResponse("bad Content-Length"))?,
            );
        } else if h.name.eq_ignore_ascii_case("content-encoding")
            && !h.value.eq_ignore_ascii_case(b"identity")
        {
            return Err(GetError::BadResponse("compressed body"));
        }
    }
    Ok(Some(Head {
        len,
        chunked,
        content_length,
    }))
}

/// The body once the framing says it is all there; None while more is expected, or when only
/// the connection's close marks its end.
fn complete_body(buf: &[u8], max_body: usize) -> Result<Option<Vec<u8>>, GetError> {
    let Some(h) = head(buf)? else {
        return Ok(None);
    };
    let rest = &buf[h.len..];
    if h.chunked {
        return dechunk(rest, max_body);
    }
    match h.content_length {
        Some(n) if n > max_body => Err(GetError::TooLarge(max_body)),
        Some(n) if rest.len() >= n => Ok(Some(rest[..n].to_vec())),
        _ => Ok(None),
    }
}

/// After EOF: a body delimited by the close, or one the framing says was cut short.
fn until_close(buf: &[u8], max_body: usize) -> Result<Vec<u8>, GetError> {
    let Some(h) = head(buf)? else {
        return Err(GetError::BadResponse("connection closed inside the header"));
    };
    if h.chunked || h.content_length.is_some() {
        return Err(GetError::BadResponse("connection closed inside the body"));
    }
    if buf.len() - h.len > max_body {
        return Err(GetError::TooLarge(max_body));
    }
    Ok(buf[h.len..].to_vec())
}

/// Chunked transfer coding: Some(body) once the last chunk is in, None while incomplete.
fn dechunk(mut s: &[u8], max_body: usize) -> Result<Option<Vec<u8>>, GetError> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = memchr::memmem::find(s, b"\r\n") else {
            return if s.len() > 1024 {
                Err(GetError::BadResponse("chunk size line too long"))
            } else {
                Ok(None)
            };
        };
        let line =
            std::str::from_utf8(&s[..eol]).map_err(|_| GetError::BadResponse("bad chunk size"))?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(hex, 16).map_err(|_| GetError::BadResponse("bad chunk size"))?;
        s = &s[eol + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if body.len().saturating_add(size) > max_body {
            return Err(GetError::TooLarge(max_body));
        }
        if s.len() < size + 2 {
            return Ok(None);
        }
        if &s[size..size + 2] != b"\r\n" {
            return Err(GetError::BadResponse("chunk not followed by CRLF"));
        }
        body.extend_from_slice(&s[..size]);
        s = &s[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use std::{io::BufRead, net::TcpListener, thread};

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
            conn.write_all(response).unwrap();
            if then_hold {
                thread::sleep(Duration::from_secs(3));
            }
        });
        addr
    }

    const T: Duration = Duration::from_secs(2);

    #[test]
    fn reads_content_length_chunked_and_close_delimited_bodies() {
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\na 1\n", true);
        assert_eq!(get(a, "/metrics", T, 1024).unwrap(), b"a 1\n");
        let a = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na 1\n\r\n4;x=y\r\nb 2\n\r\n0\r\n\r\n",
            true,
        );
        assert_eq!(get(a, "/metrics", T, 1024).unwrap(), b"a 1\nb 2\n");
        let a = serve_once(b"HTTP/1.0 200 OK\r\n\r\nc 3\n", false);
        assert_eq!(get(a, "/metrics", T, 1024).unwrap(), b"c 3\n");
    }

    #[test]
    fn failures_are_typed() {
        let a = serve_once(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert!(matches!(get(a, "/x", T, 1024), Err(GetError::Status(404))));
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", false);
        assert!(matches!(get(a, "/x", T, 1024), Err(GetError::TooLarge(_))));
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", false);
        assert!(matches!(
            get(a, "/x", T, 1024),
            Err(GetError::BadResponse(_))
        ));
        let a = serve_once(b"garbage\r\n\r\n", false);
        assert!(matches!(
            get(a, "/x", T, 1024),
            Err(GetError::BadResponse(_))
        ));
        // Headers sent, body never: the deadline ends it.
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true);
        let t0 = Instant::now();
        assert!(matches!(
            get(a, "/x", Duration::from_millis(300), 1024),
            Err(GetError::Timeout)
        ));
        assert!(t0.elapsed() < Duration::from_secs(2));
        // Nobody listening.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(matches!(
            get(port, "/x", T, 1024),
            Err(GetError::Connect(_))
        ));
    }
}
