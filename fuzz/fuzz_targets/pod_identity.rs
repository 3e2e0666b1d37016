//! Feeds arbitrary bytes to pod identity's parsers: /proc/PID/cgroup text, Kubernetes watch
//! lines (pod objects of any shape), then looks the parsed containers up. Beyond "never panics": a container
//! id is 64 lowercase hex digits, the cache stays within its bound, and a lookup only finds a
//! pod the cache holds.
#![no_main]

use inferscope::testing::{MAX_PODS, PodStore, apply_watch_line, container};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if let Some(id) = container::parse(&text) {
        assert_eq!(id.id.len(), 64);
        assert!(
            id.id
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        if let Some(uid) = &id.pod_uid {
            assert_eq!(uid.len(), 36);
        }
    }
    let store = PodStore::default();
    let mut version = String::new();
    // Lines as a watch streams them; every event kind, pod objects of any shape.
    for line in rest.split_inclusive(|b| *b == b'\n') {
        if apply_watch_line(&store, line, &mut version).is_err() && cfg % 2 == 0 {
            break;
        }
    }
    assert!(store.len() <= MAX_PODS);
    if let Some(id) = container::parse(&text) {
        if let Some(pod) = store.find(&id.id, id.pod_uid.as_deref()) {
            assert!(!pod.uid.is_empty());
        }
    }
});
