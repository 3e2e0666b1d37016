//! The agent's decoder for what CUPTI shims send over the Unix socket: arbitrary bytes, split at
//! arbitrary points, must never panic or buffer without bound.
#![no_main]
use inferscope_decode::shim::{FrameDecoder, FrameError, MAX_MESSAGE_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the read size, so frames split across reads get exercised.
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(split).max(1);
    let mut d = FrameDecoder::new();
    for piece in rest.chunks(chunk) {
        d.push(piece);
        loop {
            match d.next_batch() {
                Ok(Some(_)) | Err(FrameError::Decode) => continue,
                Ok(None) => break,
                Err(FrameError::BadLength | FrameError::TooLarge(_)) => return,
            }
        }
        assert!(d.buffered() <= MAX_MESSAGE_BYTES + 16 + chunk);
    }
});
