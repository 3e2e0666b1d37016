//! The kernel side of capture: loading and attaching the eBPF programs and owning their maps
//! ([`probes`]), turning ring-buffer bytes into typed events ([`records`], with large sends and
//! receives rejoined from their chunks in [`chunks`]), the tracepoint layouts this kernel uses
//! ([`tracefs`]) and struct member offsets it has ([`btf`]), the token-event template the exit
//! program compares ([`stream_template`]), what the agent's capabilities allow on this
//! kernel ([`privileges`]), and what its verifier made of each program ([`verifier`]).
pub(crate) mod btf;
pub(crate) mod chunks;
pub(crate) mod commands;
pub(crate) mod gpu_records;
pub(crate) mod kfunc;
pub(crate) mod privileges;
pub(crate) mod probes;
pub(crate) mod records;
pub(crate) mod stream_template;
pub(crate) mod tracefs;
pub(crate) mod verifier;
