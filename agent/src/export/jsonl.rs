//! One JSON object per line, written as each request ends so `tail -f` follows along.
//!
//! A line is written whole or not at all: it is serialised first, written with one call, and a
//! write that fails part-way (disk full) is cut back off the file, so the file never holds half
//! a line and the next record, once space returns, starts on a line of its own. Failed lines are
//! counted (`failed`); the writer keeps trying with each new record.
use std::{
    fs::File,
    io::{self, Seek, SeekFrom, Write},
    path::Path,
};

use serde::Serialize;

pub(crate) struct JsonlWriter {
    file: File,
    /// Bytes of whole lines in the file: where the next line starts.
    len: u64,
    /// The line being written, reused.
    line: Vec<u8>,
    pub written: u64,
    /// Lines dropped because the write failed.
    pub failed: u64,
}

impl JsonlWriter {
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        Ok(Self::from_file(File::create(path)?))
    }

    fn from_file(file: File) -> Self {
        Self {
            file,
            len: 0,
            line: Vec::new(),
            written: 0,
            failed: 0,
        }
    }

    /// Writes `record`; a failure is counted and, the first time for this file, logged as an
    /// error naming `what` was lost (later failures are only counted, so a full disk does not
    /// flood the log). Returns whether the line was written.
    pub(crate) fn write_or_report<T: Serialize>(&mut self, record: &T, what: &str) -> bool {
        match self.write(record) {
            Ok(()) => true,
            Err(e) => {
                if self.failed == 1 {
                    tracing::error!(
                        "writing {what} failed: {e}; that line is dropped whole, later ones are tried (each failure is counted)"
                    );
                }
                false
            }
        }
    }

    pub(crate) fn write<T: Serialize>(&mut self, record: &T) -> io::Result<()> {
        self.line.clear();
        if let Err(e) = serde_json::to_writer(&mut self.line, record) {
            self.failed += 1;
            return Err(e.into());
        }
        self.line.push(b'\n');
        match self.file.write_all(&self.line) {
            Ok(()) => {
                self.len += self.line.len() as u64;
                self.written += 1;
                Ok(())
            }
            Err(e) => {
                self.failed += 1;
                // Cut off whatever part of the line made it, so the file stays whole lines.
                let undo = self
                    .file
                    .set_len(self.len)
                    .and_then(|()| self.file.seek(SeekFrom::Start(self.len)));
                match undo {
                    Ok(_) => Err(e),
                    Err(undo) => Err(io::Error::new(
                        e.kind(),
                        format!("{e}; and cutting the partial line failed: {undo}"),
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Line {
        n: u32,
        pad: String,
    }

    /// /dev/full fails every write with ENOSPC: each line is counted as failed, and the writer
    /// keeps going.
    #[test]
    fn a_full_device_fails_lines_whole_and_counts_them() {
        let Ok(file) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            return; // not Linux: nothing to test against
        };
        let mut w = JsonlWriter::from_file(file);
        for n in 0..3 {
            let line = Line { n, pad: "x".into() };
            assert!(w.write(&line).is_err());
        }
        assert_eq!((w.written, w.failed), (0, 3));
    }

    #[test]
    fn lines_are_whole() {
        let dir = std::env::temp_dir().join(format!("inferscope-jsonl-{}", std::process::id()));
        let mut w = JsonlWriter::create(&dir).unwrap();
        for n in 0..3 {
            w.write(&Line {
                n,
                pad: "y".repeat(n as usize),
            })
            .unwrap();
        }
        let text = std::fs::read_to_string(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(text.lines().count(), 3);
        assert!(text.ends_with('\n'));
        assert_eq!(w.written, 3);
    }
}
