//! The connection tracker under whole request streams: token events as the kernel summarises
//! them (`tokens`), and recovery after lost records (`resync`).
mod resync;
mod tokens;
mod tracker;
