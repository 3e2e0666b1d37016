//! Feeds arbitrary bytes to the user-defined probe spec parser (`--probes FILE`): it never
//! panics, and whatever it accepts stays inside the limits the kernel program relies on.
#![no_main]

use inferscope::testing::ProbeSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = ProbeSpec::parse(text) else {
        return;
    };
    assert!(!spec.probes.is_empty() && spec.probes.len() <= 64);
    assert!(spec.max_failures >= 1);
    for probe in &spec.probes {
        let c = probe.config;
        assert!(c.n_derefs <= 4);
        assert!(matches!(c.width, 0 | 1 | 2 | 4 | 8));
        assert!(c.width != 0 || (1..=64).contains(&c.string_len));
        assert!(c.source <= 2 && c.reg <= 5);
        assert!(!probe.object.trim().is_empty() && !probe.symbol.trim().is_empty());
    }
});
