//! TLS library probes: uprobes on OpenSSL's `SSL_read[_ex]`, `SSL_write[_ex]` and
//! `SSL_do_handshake` in every traced process that maps a copy of OpenSSL, so an engine served
//! over HTTPS is recorded from its plaintext exactly as one served in clear text (the kernel
//! side, and how an `SSL*` is tied to its connection, is `ebpf/probes/src/socket/tls.rs`).
//!
//! The functions are looked up by symbol in every mapped object that could hold them, not in
//! `libssl` alone: Python's `_ssl` module, a CPython or engine build that links OpenSSL in, or a
//! wheel that bundles its own `libssl-<hash>.so` each hold their own copy, and each copy a
//! process maps gets probes. TLS that no OpenSSL symbol names (statically linked and stripped,
//! BoringSSL inside gRPC or Envoy, Go's crypto/tls, rustls) is seen by the kernel as TLS records
//! and counted per connection as `tls_connections_undecoded`, never dropped silently.
use std::path::PathBuf;

use inferscope_common::TlsApi;
use tracing::{info, warn};

use crate::capture::{SocketProbes, elf::symbols::ElfSymbols, process::procfs};

/// The entry and return programs; the attach cookie names the function ([`TlsApi`]).
const PROGRAMS: (&str, &str) = ("tls_call", "tls_return");

/// Parts of a mapped file's name that mark it as a possible home of OpenSSL: the library
/// itself, Python's `_ssl` extension and libpython (builds that link OpenSSL in), and
/// `libcrypto`-named bundles. The process's executable is always looked at too.
const OBJECT_HINTS: &[&str] = &["ssl", "crypto", "python"];

/// Whether a mapped file could hold the TLS functions.
pub(crate) fn could_hold(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    OBJECT_HINTS.iter().any(|hint| name.contains(hint))
}

/// What [`attach`] probed.
#[derive(Debug, Default)]
pub(crate) struct Attached {
    /// Probes attached (entry and return pairs).
    pub live: usize,
    /// The objects that got them (paths in the process's mount namespace).
    pub objects: Vec<String>,
}

/// Attaches the entry and return probes of every hooked function in every object `tgid` maps
/// that defines them, save the objects in `probed` (a copy already probed): a process may map
/// another copy of OpenSSL later (a wheel that bundles its own, imported after start-up), and is
/// looked at again when its mapped files change.
pub(crate) fn attach(probes: &mut SocketProbes, tgid: u32, probed: &[String]) -> Attached {
    let mut outcome = Attached::default();
    let exe = std::fs::read_link(format!("/proc/{tgid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let candidates: Vec<String> = procfs::mapped_files(tgid)
        .into_iter()
        .filter(|p| could_hold(p) || exe.as_deref() == Some(p.as_str()))
        .filter(|p| !probed.contains(p))
        .collect();
    let mut objects = Vec::new();
    for path in &candidates {
        // Paths in /proc/PID/maps are in the process's mount namespace.
        let readable = PathBuf::from(format!("/proc/{tgid}/root{path}"));
        let table = match ElfSymbols::load(&readable) {
            Ok(table) => table,
            // Data files and non-ELF mappings land here; only an unreadable library matters.
            Err(e) if path.contains(".so") => {
                warn!(pid = tgid, object = %path, "cannot read symbols for the TLS probes: {e}");
                continue;
            }
            Err(_) => continue,
        };
        let offsets: Vec<(TlsApi, u64)> = TlsApi::ALL
            .iter()
            .filter_map(|&api| {
                let found = table.resolve(api.symbol());
                (found.len() == 1).then(|| (api, found[0].file_offset))
            })
            .collect();
        // SSL_write and SSL_read (or their _ex forms) both, or the copy is of no use.
        let reads = offsets.iter().any(|(api, _)| api.reads());
        let writes = offsets.iter().any(|(api, _)| api.writes());
        if reads && writes {
            objects.push((path.clone(), readable, offsets));
        }
    }
    for (path, readable, offsets) in &objects {
        let mut attached = Vec::new();
        for &(api, offset) in offsets {
            let both = probes
                .attach_uprobe_pair(PROGRAMS, readable, offset, tgid, api as u64)
                .map_err(|e| {
                    warn!(
                        pid = tgid,
                        object = %path,
                        function = api.symbol(),
                        "attaching the TLS probe failed: {e}; this process's HTTPS traffic is counted as undecoded"
                    )
                })
                .is_ok();
            if both {
                outcome.live += 1;
                attached.push(api.symbol());
            }
        }
        if !attached.is_empty() {
            info!(pid = tgid, object = %path, functions = ?attached, "TLS probes attached");
            outcome.objects.push(path.clone());
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_that_may_hold_openssl_are_looked_at() {
        for path in [
            "/usr/lib/x86_64-linux-gnu/libssl.so.3",
            "/usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
            "/opt/venv/lib/python3.12/site-packages/psycopg_binary.libs/libssl-81ffa89e.so.3",
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
        ] {
            assert!(could_hold(path), "{path}");
        }
        for path in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so",
        ] {
            assert!(!could_hold(path), "{path}");
        }
    }
}
