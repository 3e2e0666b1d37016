//! Where one captured syscall goes: a server connection's bytes to the HTTP tracker, an engine's
//! IPC bytes to its decoder, anything else back to the kernel as "stop copying". The policy for
//! fds whose class changes (a ZeroMQ tcp:// connection on a listening port) lives here too, so
//! the drain loop in `mod.rs` only reads records and hands them on.
use inferscope_common::{CONN_PREEXISTING, CONN_TLS, SyscallKind};
use inferscope_decode::zmtp;
use inferscope_model::{Counter, Stats};
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::warn;

use super::Correlated;
use crate::{
    capture::{
        FdClass, FdClassifier, SyscallEvent, kernel::commands::KernelCommand,
        process::adopt::Adoption,
    },
    correlate::Peer,
    engines::{IpcBytes, IpcDirection, IpcVerdict},
};

/// Listening ports per traced process.
pub(super) type Ports = FxHashMap<u32, Vec<u16>>;

/// What decides where a record goes: the traced processes' listening ports, each fd's class,
/// the ports the kernel adopted for a restarted engine, and which processes' TLS is decoded.
pub(super) struct Routes {
    pub ports: Ports,
    pub classifier: FdClassifier,
    pub adoption: Adoption,
    pub tls: TlsProcesses,
}

/// What one syscall record is handed to: the drain's state, borrowed.
pub(super) struct Sockets<'p> {
    pub routes: &'p mut Routes,
    pub correlated: &'p mut Correlated,
    pub stats: &'p mut Stats,
    /// Connections whose capture should stop (applied as kernel commands after the drain).
    pub ignore: &'p mut Vec<(u32, i32, u64)>,
}

/// `ret` of a [`SyscallKind::Tls`] record that tells a finished handshake (0: TLS seen).
const TLS_HANDSHAKE_DONE: i64 = 1;

/// Processes whose TLS the agent decodes (the library probes are attached), and those already
/// warned about TLS it cannot decode.
#[derive(Default)]
pub(super) struct TlsProcesses {
    /// Per process, the objects (copies of OpenSSL) whose functions are probed.
    probed: FxHashMap<u32, Vec<String>>,
    warned: FxHashSet<u32>,
}

/// Copies of OpenSSL probed per process, at most: more are not looked for.
pub(super) const MAX_TLS_OBJECTS: usize = 16;

impl TlsProcesses {
    /// `objects` of `tgid` got the TLS probes; whether they are its first.
    pub(super) fn probed(&mut self, tgid: u32, objects: Vec<String>) -> bool {
        let known = self.probed.entry(tgid).or_default();
        let first = known.is_empty();
        for object in objects {
            if known.len() < MAX_TLS_OBJECTS && !known.contains(&object) {
                known.push(object);
            }
        }
        first
    }

    /// The objects of `tgid` already probed.
    pub(super) fn objects(&self, tgid: u32) -> &[String] {
        self.probed.get(&tgid).map_or(&[], Vec::as_slice)
    }

    /// Whether `tgid` may map another copy to probe.
    pub(super) fn room(&self, tgid: u32) -> bool {
        self.objects(tgid).len() < MAX_TLS_OBJECTS
    }

    /// A connection of `tgid` turned out to be TLS: whether its plaintext will come (else it
    /// is counted, and the process warned about once).
    fn decodes(&mut self, tgid: u32) -> bool {
        if self.probed.contains_key(&tgid) {
            return true;
        }
        if self.warned.insert(tgid) {
            warn!(
                pid = tgid,
                "this process serves TLS that inferscope cannot decrypt: no OpenSSL with its symbols is mapped (statically linked TLS such as BoringSSL, Go or rustls), or TLS probes are off (--no-tls); its HTTPS requests are not recorded and are counted in tls_connections_undecoded"
            );
        }
        false
    }
}

impl inferscope_model::PerProcess for TlsProcesses {
    fn process_gone(&mut self, tgid: u32) {
        self.probed.remove(&tgid);
        self.warned.remove(&tgid);
    }
}

impl Sockets<'_> {
    pub(super) fn on_syscall(&mut self, ev: &SyscallEvent<'_>) {
        let Some(listening) = self.routes.ports.get(&ev.tgid) else {
            // A record from a process detached a moment ago.
            self.stats.bump(Counter::RecordsUntracedProcess);
            return;
        };
        let records = &mut self.correlated.records;
        match ev.kind {
            SyscallKind::Accept => {
                self.routes.classifier.on_close(ev.tgid, ev.conn_key());
                let peer = Peer {
                    sock: ev.sock,
                    ..Peer::default()
                };
                self.correlated.tracker.on_accept(ev, peer, records);
            }
            SyscallKind::Close => {
                self.correlated.ipc.on_close(ev.tgid, ev.fd);
                self.correlated.tracker.on_close(ev, records);
                self.routes.classifier.on_close(ev.tgid, ev.conn_key());
            }
            SyscallKind::Shutdown => self.correlated.tracker.on_shutdown(ev),
            // The TLS library finished the server's handshake (see `wire_arrival`).
            SyscallKind::Tls if ev.ret == TLS_HANDSHAKE_DONE => {
                self.correlated.tracker.on_tls_handshake(ev)
            }
            SyscallKind::Tls => {
                if !self.routes.tls.decodes(ev.tgid) {
                    self.stats.bump(Counter::TlsConnectionsUndecoded);
                    // Nothing of it can be decoded: its EOF and errors need not come either.
                    self.ignore.push((ev.tgid, ev.fd, ev.conn_gen));
                }
            }
            // Kept in the kernel between entry and exit; never emitted.
            SyscallKind::Dup => self.stats.bump(Counter::RecordUnexpectedKind),
            SyscallKind::Read | SyscallKind::Write => {
                let wants_ipc = self
                    .correlated
                    .ipc
                    .wants(ev.tgid)
                    .then(|| zmtp::looks_like_zmtp(ev.payload) && ev.lost_bytes() == 0);
                match self.routes.classifier.classify(ev, listening, wants_ipc) {
                    FdClass::Ipc if ev.ret > 0 => {
                        if self.correlated.ipc.on_bytes(
                            &ipc_bytes(ev),
                            ev.ts_enter_ns,
                            &mut self.correlated.steps,
                        ) == IpcVerdict::NotIpc
                        {
                            self.stats.bump(Counter::RecordsNotEngineIpc);
                            self.ignore.push((ev.tgid, ev.fd, ev.conn_gen));
                        }
                    }
                    // EOF or an error: nothing to decode.
                    FdClass::Ipc => {}
                    FdClass::Other if self.routes.adoption.is_pending(ev.tgid) => {
                        // Adopted by the kernel, not attached yet: its engine plugin has not
                        // said whether it decodes IPC on fds like this one (vLLM binds its
                        // HTTP port before its engine core connects), so no verdict yet.
                        self.routes.classifier.forget_class(ev.tgid, ev.conn_key());
                        self.stats.bump(Counter::RecordsBeforeAttach);
                    }
                    FdClass::Other => {
                        self.stats.bump(Counter::RecordsNotServerConnection);
                        self.ignore.push((ev.tgid, ev.fd, ev.conn_gen));
                    }
                    FdClass::Server { local_port, remote } => {
                        let peer = Peer {
                            local_port,
                            remote,
                            sock: ev.sock,
                            preexisting: ev.conn_flags & CONN_PREEXISTING != 0,
                            tls: ev.conn_flags & CONN_TLS != 0,
                        };
                        if ev.kind == SyscallKind::Read {
                            self.correlated.tracker.on_read(ev, peer, records);
                        } else {
                            self.correlated.tracker.on_write(ev, peer, records);
                        }
                    }
                }
            }
        }
    }
}

/// Connections the tracker gave up on as not HTTP: on an engine whose IPC is decoded, a ZeroMQ
/// tcp:// connection joined after its greeting goes to the IPC decoder (which looks for a frame
/// boundary); the rest, and `ignore`, are to be ignored in the kernel. With the IPC connections
/// the classifier noted, what this drain's routing wants of the kernel.
pub(super) fn kernel_commands(
    routes: &mut Routes,
    correlated: &mut Correlated,
    stats: &mut Stats,
    ignore: Vec<(u32, i32, u64)>,
) -> Vec<KernelCommand> {
    let classifier = &mut routes.classifier;
    let mut commands: Vec<KernelCommand> = ignore
        .into_iter()
        .map(|(tgid, fd, conn_gen)| KernelCommand::Ignore { tgid, fd, conn_gen })
        .collect();
    for (tgid, fd, conn_gen) in correlated.tracker.take_ignored() {
        let key = if conn_gen != 0 {
            conn_gen
        } else {
            u64::from(fd as u32)
        };
        if correlated.ipc.wants(tgid) && classifier.reroute_to_ipc(tgid, key) {
            stats.bump(Counter::ConnectionsReroutedToIpc);
            if conn_gen != 0 {
                classifier.new_ipc.push((tgid, fd, conn_gen));
            }
        } else {
            commands.push(KernelCommand::Ignore { tgid, fd, conn_gen });
        }
    }
    commands.extend(
        classifier
            .new_ipc
            .drain(..)
            .map(|(tgid, fd, conn_gen)| KernelCommand::KeepWhole { tgid, fd, conn_gen }),
    );
    commands
}

/// One captured syscall as the engines' IPC decoders see it.
fn ipc_bytes<'a>(ev: &SyscallEvent<'a>) -> IpcBytes<'a> {
    // A failed copy loses the whole syscall.
    let (data, lost) = if ev.copy_failed {
        (&[][..], ev.ret.max(0) as u64)
    } else {
        (ev.payload, ev.lost_bytes())
    };
    IpcBytes {
        tgid: ev.tgid,
        tid: ev.tid,
        fd: ev.fd,
        conn_gen: ev.conn_gen,
        direction: if ev.kind == SyscallKind::Read {
            IpcDirection::Read
        } else {
            IpcDirection::Write
        },
        data,
        lost,
    }
}

#[cfg(test)]
mod tests {
    use inferscope_model::PerProcess;

    use super::*;

    #[test]
    fn tls_is_decoded_only_where_the_probes_are_attached() {
        let mut tls = TlsProcesses::default();
        assert!(tls.probed(10, vec!["/usr/lib/libssl.so.3".into()]));
        assert!(tls.decodes(10));
        assert!(!tls.decodes(11));
        assert!(!tls.decodes(11));
        assert_eq!(tls.warned.len(), 1, "one warning per process");
        tls.process_gone(10);
        tls.process_gone(11);
        assert!(!tls.decodes(10));
        assert!(tls.probed.is_empty());
    }

    /// A copy loaded later is added to the process's probed objects, each once, up to the
    /// bound past which no more are looked for.
    #[test]
    fn each_copy_of_openssl_is_probed_once_up_to_the_bound() {
        let mut tls = TlsProcesses::default();
        assert!(tls.probed(7, vec!["/usr/lib/libssl.so.3".into()]));
        assert!(!tls.probed(
            7,
            vec!["/w/libssl-ab12.so.3".into(), "/usr/lib/libssl.so.3".into()]
        ));
        assert_eq!(
            tls.objects(7),
            ["/usr/lib/libssl.so.3", "/w/libssl-ab12.so.3"]
        );
        assert!(tls.room(7));
        tls.probed(7, (0..40).map(|i| format!("/w/{i}/libssl.so")).collect());
        assert_eq!(tls.objects(7).len(), MAX_TLS_OBJECTS);
        assert!(!tls.room(7));
        assert!(tls.objects(8).is_empty() && tls.room(8));
    }
}
