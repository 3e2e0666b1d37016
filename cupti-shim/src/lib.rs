//! `libinferscope_cupti.so`: a CUPTI injection library. The CUDA driver loads it at `cuInit` when
//! `CUDA_INJECTION64_PATH` names it and calls [`InitializeInjection`]. From then on every kernel the
//! process runs is recorded (launch callbacks for the host side, activity buffers for the GPU side),
//! joined by correlation id and streamed to the inferscope agent over a Unix socket.
//!
//! The engine is never harmed: nothing panics across the FFI boundary, nothing blocks a launching
//! thread, and when another CUPTI client already holds the single subscriber slot the shim steps aside.
mod activity;
mod callbacks;
mod clock;
mod config;
mod init;
mod launches;
pub mod names;
mod sender;
mod sink;
mod state;

use std::ffi::c_int;

/// Entry point the CUDA driver calls after loading `CUDA_INJECTION64_PATH`. Always returns 1
/// (success): a failure to set up tracing must never fail the engine's `cuInit`.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    // A panic must not unwind into the driver.
    let _ = std::panic::catch_unwind(init::initialize);
    1
}
