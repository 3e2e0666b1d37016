//! The kernel side of capture: loading and attaching the eBPF programs and owning their maps
//! ([`probes`]), turning ring-buffer bytes into typed events ([`records`], with large sends and
//! receives rejoined from their chunks in [`chunks`]), the tracepoint layouts this kernel uses
//! ([`tracefs`]), the token-event template the exit program compares ([`stream_template`]), and
//! what the agent's capabilities allow on this kernel ([`privileges`]).
pub mod chunks;
pub mod privileges;
pub mod probes;
pub mod records;
pub mod stream_template;
pub mod tracefs;
