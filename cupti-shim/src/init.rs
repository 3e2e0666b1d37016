//! Injection-time setup: load CUPTI, subscribe, enable the launch callbacks and kernel activity,
//! start the sender thread, and flush at exit.
use std::{
    sync::{Mutex, Once, atomic::Ordering},
    time::Duration,
};

use cudarc::cupti::sys::{self, CUpti_ActivityKind as Kind, CUptiResult};

use crate::{
    activity, callbacks,
    clock::Clock,
    config::{Config, env_flag},
    launches::LaunchTable,
    names::NameCache,
    sender,
    sink::Sink,
    state::{self, Shim, state},
};

fn log(msg: &str) {
    eprintln!("inferscope-cupti[{}]: {msg}", std::process::id());
}

pub(crate) fn initialize() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(msg) = setup() {
            log(&msg);
        }
    });
}

/// Symbols used from CUPTI's own threads: checked up front, because cudarc panics on a missing
/// symbol and a panic inside a C callback would abort the engine.
const REQUIRED: &[&str] = &[
    "cuptiSubscribe",
    "cuptiEnableCallback",
    "cuptiGetTimestamp",
    "cuptiGetVersion",
    "cuptiActivityRegisterCallbacks",
    "cuptiActivityRegisterTimestampCallback",
    "cuptiActivityEnable",
    "cuptiActivityFlushAll",
    "cuptiActivityGetNextRecord",
    "cuptiActivityGetNumDroppedRecords",
];

fn setup() -> Result<(), String> {
    if env_flag("INFERSCOPE_SHIM_DISABLE") {
        return Ok(());
    }
    // SAFETY: only tries to dlopen candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcupti not found (looked for libcupti.so, libcupti.so.12 and the other names cudarc \
             tries); add the directory holding it (e.g. /usr/local/cuda/extras/CUPTI/lib64 or the \
             nvidia-cuda-cupti wheel's lib/) to LD_LIBRARY_PATH. Kernels are not recorded; the \
             engine runs unchanged."
            .into());
    }
    // SAFETY: culib() is safe to call once is_culib_present() said yes.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED {
        // SAFETY: only looks the symbol up.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(format!(
                "libcupti lacks {name} (too old?); kernels are not recorded"
            ));
        }
    }
    let mut cupti_version = 0u32;
    // SAFETY: valid out-pointer.
    unsafe { sys::cuptiGetVersion(&mut cupti_version) };
    let config = Config::from_env();
    let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_batches);
    let shim = Shim {
        pid: std::process::id(),
        launches: LaunchTable::new(),
        clock: Clock::new(),
        sink: Sink::new(tx),
        cupti_version,
        driver_version: driver_version(),
        names: Mutex::new(NameCache::new(8192)),
        config,
    };
    let Some(st) = state::install(shim) else {
        return Ok(());
    };

    let mut subscriber: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: valid out-pointer and callback.
    let rc = unsafe {
        sys::cuptiSubscribe(
            &mut subscriber,
            Some(callbacks::on_callback),
            std::ptr::null_mut(),
        )
    };
    if rc == CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
        return Err(
            "another CUPTI client (nsys, torch.profiler/Kineto, another injection) already \
             holds CUPTI's subscriber slot; inferscope steps aside and does not record kernels \
             in this process. The engine runs unchanged."
                .into(),
        );
    }
    if rc != CUptiResult::CUPTI_SUCCESS {
        return Err(format!(
            "cuptiSubscribe failed ({rc:?}); kernels are not recorded"
        ));
    }
    let mut enabled = 0;
    for (domain, cbid, _) in callbacks::LAUNCH_CALLBACKS {
        // SAFETY: subscriber from cuptiSubscribe. Ids unknown to this CUPTI just fail.
        let rc = unsafe { sys::cuptiEnableCallback(1, subscriber, *domain, *cbid) };
        if rc == CUptiResult::CUPTI_SUCCESS {
            enabled += 1;
        }
    }
    if enabled == 0 {
        log("no launch callback could be enabled; kernels carry no launch thread or host time");
    }
    // Before any activity kind is enabled, or CUPTI refuses it.
    st.clock.setup();
    // SAFETY: valid callbacks.
    let rc = unsafe {
        sys::cuptiActivityRegisterCallbacks(
            Some(activity::buffer_requested),
            Some(activity::buffer_completed),
        )
    };
    if rc != CUptiResult::CUPTI_SUCCESS {
        return Err(format!(
            "cuptiActivityRegisterCallbacks failed ({rc:?}); kernels are not recorded"
        ));
    }
    // SAFETY: plain FFI call.
    let rc = unsafe { sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) };
    if rc != CUptiResult::CUPTI_SUCCESS {
        return Err(format!(
            "enabling kernel activity failed ({rc:?}); kernels are not recorded"
        ));
    }
    if st.config.memcpy {
        // SAFETY: plain FFI calls; failure only loses memcpy records.
        unsafe {
            sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_MEMCPY);
            sys::cuptiActivityEnable(Kind::CUPTI_ACTIVITY_KIND_MEMSET);
        }
    }
    // The first connection attempt happens here, not on the sender thread, so that kernels of a
    // short-lived process are not counted as "nobody listening" while that thread starts. A Unix
    // connect answers at once (refused, absent or accepted), so cuInit is not held up.
    let first = sender::connect(st);
    if first.is_some() {
        st.sink.set_connected(true);
    }
    std::thread::Builder::new()
        .name("inferscope-shim".into())
        .spawn(move || sender::run(st, rx, first))
        .map_err(|e| format!("could not start the sender thread: {e}"))?;
    // SAFETY: registering a plain extern "C" fn.
    unsafe { libc::atexit(at_exit) };
    Ok(())
}

fn driver_version() -> i32 {
    // The driver is already loaded (it is what loaded us); ask it through cudarc's loader.
    // SAFETY: only dlopens candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    let mut v = 0i32;
    let ok = std::panic::catch_unwind(|| {
        let mut v = 0i32;
        // SAFETY: valid out-pointer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        v
    });
    if let Ok(x) = ok {
        v = x;
    }
    v
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(st) = state() else { return };
        // A child forked after cuInit has neither CUDA nor the sender thread: touch nothing.
        if st.pid != std::process::id() {
            return;
        }
        // Forced flush: hands every buffer, even those with kernels still running, to CUPTI's
        // completion callback so the last records of a short-lived process are not lost.
        // SAFETY: plain FFI call.
        unsafe { sys::cuptiActivityFlushAll(1) };
        // Drops since the last completed buffer (the global queue: no context, stream 0).
        let mut dropped = 0usize;
        // SAFETY: valid out-pointer; a null context asks for the global count.
        let rc = unsafe {
            sys::cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut dropped)
        };
        if rc == CUptiResult::CUPTI_SUCCESS && dropped > 0 {
            st.sink.add_cupti_dropped(dropped as u64);
        }
        st.sink.stop(Duration::from_secs(2));
        if st.config.summary {
            let t = &st.sink.totals;
            log(&format!(
                "{} records sent, {} dropped (agent absent or slow), {} dropped by CUPTI, \
                 {} without a launch record; clock {}",
                t.sent.load(Ordering::Relaxed),
                t.dropped.load(Ordering::Relaxed),
                t.cupti_dropped.load(Ordering::Relaxed),
                t.unjoined.load(Ordering::Relaxed),
                st.clock.source()
            ));
        }
    });
}
