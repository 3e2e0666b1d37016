//! One JSON object per line, flushed as each request ends so `tail -f` follows along.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use serde::Serialize;

pub struct JsonlWriter {
    out: BufWriter<File>,
    pub written: u64,
}

impl JsonlWriter {
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(Self {
            out: BufWriter::new(File::create(path)?),
            written: 0,
        })
    }

    pub fn write<T: Serialize>(&mut self, record: &T) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        self.written += 1;
        Ok(())
    }
}
