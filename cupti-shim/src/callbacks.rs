//! The CUPTI callback run on the engine's launching threads. Its whole cost is on the launch path,
//! so it only reads the clock and writes one or two lock-free slots (see BENCHMARKS.md).
use std::cell::Cell;

use cudarc::cupti::sys::{self, CUpti_CallbackDomain as Domain};
use inferscope_model::clock::monotonic_now_ns;

use crate::{launches::Launch, state::state};

/// (domain, callback id, index into `launches::API_NAMES`).
pub(crate) const LAUNCH_CALLBACKS: &[(Domain, u32, u8)] = &[
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 211, 1),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 214, 2),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 430, 3),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 431, 4),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 269, 5),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 270, 6),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 311, 7),
    (Domain::CUPTI_CB_DOMAIN_RUNTIME_API, 312, 8),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 307, 9),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 442, 10),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 652, 11),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 653, 12),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 477, 13),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 478, 14),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 514, 15),
    (Domain::CUPTI_CB_DOMAIN_DRIVER_API, 515, 16),
];

fn api_index(domain: Domain, cbid: u32) -> u8 {
    LAUNCH_CALLBACKS
        .iter()
        .find(|(d, id, _)| *d == domain && *id == cbid)
        .map_or(0, |(_, _, i)| *i)
}

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
    /// The runtime launch this thread is inside (its driver call nests in it): (api, host time).
    static OUTER: Cell<Option<(u8, u64)>> = const { Cell::new(None) };
}

fn tid() -> u32 {
    TID.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        // SAFETY: gettid has no preconditions.
        let v = unsafe { libc::gettid() } as u32;
        t.set(v);
        v
    })
}

/// The subscriber callback. `extern "C"`: a panic here aborts, so nothing in it can panic.
///
/// # Safety
///
/// `cbdata` is null or, for the runtime and driver API domains, points at a
/// `CUpti_CallbackData` valid for the call, as CUPTI passes it.
pub(crate) unsafe extern "C" fn on_callback(
    _userdata: *mut std::ffi::c_void,
    domain: Domain,
    cbid: u32,
    cbdata: *const std::ffi::c_void,
) {
    let Some(st) = state() else { return };
    if cbdata.is_null() {
        return;
    }
    // SAFETY: for the runtime and driver domains CUPTI passes a CUpti_CallbackData.
    let data = unsafe { &*(cbdata as *const sys::CUpti_CallbackData) };
    let enter = data.callbackSite == sys::CUpti_ApiCallbackSite::CUPTI_API_ENTER;
    let runtime = domain == Domain::CUPTI_CB_DOMAIN_RUNTIME_API;
    if !enter {
        if runtime {
            OUTER.with(|o| o.set(None));
        }
        return;
    }
    let api = api_index(domain, cbid);
    let (api, mono_ns) = match (runtime, OUTER.with(|o| o.get())) {
        // The driver launch inside a runtime launch: same launch, so keep the outer API and time.
        // Recording under the driver's id too means the join works whichever id the kernel carries.
        (false, Some(outer)) => outer,
        _ => (api, monotonic_now_ns()),
    };
    if runtime {
        OUTER.with(|o| o.set(Some((api, mono_ns))));
    }
    st.launches.record(
        data.correlationId,
        Launch {
            tid: tid(),
            mono_ns,
            api,
        },
    );
}
