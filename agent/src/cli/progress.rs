//! Progress of reading a large file, on a terminal only: `diagnose` over a recording of
//! hundreds of megabytes says how far it got on stderr, and redirected output stays clean.
use std::{
    io::{self, Read, Write},
    time::{Duration, Instant},
};

/// Files smaller than this are read without progress (they take well under a second).
const LARGE_FILE: u64 = 16 * 1024 * 1024;
/// At most this often a new progress line.
const EVERY: Duration = Duration::from_millis(200);

/// Whether a file of `size` bytes gets a progress line when stderr is (`terminal`) a terminal.
pub(super) fn wanted(terminal: bool, size: u64) -> bool {
    terminal && size >= LARGE_FILE
}

/// A reader that redraws "`label`: N% (read of total MiB)" on `sink` as it is read, and clears
/// the line once dropped.
pub(super) struct Progress<R, W: Write> {
    inner: R,
    sink: Option<W>,
    label: String,
    total: u64,
    read: u64,
    last: Option<Instant>,
}

impl<R, W: Write> Progress<R, W> {
    /// `sink` None: no progress at all (not a terminal, or a small file).
    pub(super) fn new(inner: R, sink: Option<W>, label: String, total: u64) -> Self {
        Self {
            inner,
            sink,
            label,
            total,
            read: 0,
            last: None,
        }
    }

    fn draw(&mut self) {
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let percent = (self.read * 100)
            .checked_div(self.total)
            .unwrap_or(100)
            .min(100);
        const MIB: u64 = 1024 * 1024;
        // A failed write to the terminal only loses the progress line.
        let _ = write!(
            sink,
            "\r{}: {percent}% ({} of {} MiB)",
            self.label,
            self.read / MIB,
            self.total / MIB
        );
        let _ = sink.flush();
    }
}

impl<R: Read, W: Write> Read for Progress<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        // The end is always drawn: the last line seen says the whole file was read.
        let done = n == 0 || self.read >= self.total;
        if self.sink.is_some() && (done || self.last.is_none_or(|t| t.elapsed() >= EVERY)) {
            self.draw();
            self.last = Some(Instant::now());
        }
        Ok(n)
    }
}

impl<R, W: Write> Drop for Progress<R, W> {
    fn drop(&mut self) {
        if self.last.is_some()
            && let Some(sink) = self.sink.as_mut()
        {
            // Erase the line: the report that follows starts on a clean one.
            let _ = write!(sink, "\r\x1b[2K");
            let _ = sink.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_files_on_a_terminal_get_progress() {
        assert!(wanted(true, 200 * 1024 * 1024));
        assert!(!wanted(false, 200 * 1024 * 1024));
        assert!(!wanted(true, 1024));
    }

    #[test]
    fn draws_the_share_read_and_clears_the_line_at_the_end() {
        let data = vec![b'x'; 4 * 1024 * 1024];
        let mut sink = Vec::new();
        {
            let mut reader = Progress::new(
                &data[..],
                Some(&mut sink),
                "records.jsonl".into(),
                data.len() as u64,
            );
            let mut chunk = vec![0; 1024 * 1024];
            assert_eq!(reader.read(&mut chunk).unwrap(), 1024 * 1024);
            std::thread::sleep(EVERY);
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).unwrap();
            assert_eq!(rest.len(), 3 * 1024 * 1024);
        }
        let text = String::from_utf8(sink).unwrap();
        assert!(
            text.starts_with("\rrecords.jsonl: 25% (1 of 4 MiB)"),
            "{text:?}"
        );
        assert!(text.contains("100% (4 of 4 MiB)"), "{text:?}");
        assert!(text.ends_with("\r\x1b[2K"), "{text:?}");
    }

    #[test]
    fn without_a_sink_nothing_is_written_and_the_bytes_pass_unchanged() {
        let data = b"{\"a\":1}\n{\"a\":2}\n".to_vec();
        let mut reader: Progress<_, Vec<u8>> = Progress::new(&data[..], None, "x".into(), 16);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        assert!(reader.sink.is_none());
    }
}
