//! The one path that forgets a traced process, whether discovery detached it or the kernel
//! adopted it and discovery never attached it: every component with state per process is
//! listed here, in the order it must forget.
use inferscope_model::{PerProcess, RequestRecord};

use super::{Sink, close, route::Ports};
use crate::{
    capture::{
        FdClassifier,
        process::{adopt::Adoption, late_attach::LateAttach},
    },
    correlate::Tracker,
    engines::IpcRouter,
    join::Join,
};

/// Every per-process component of the pipeline, borrowed for [`Processes::forget`].
pub(super) struct Processes<'a> {
    /// Capture's kernel side (`SocketProbes`).
    pub probes: &'a mut dyn PerProcess,
    /// The engine metrics scraper, when scraping.
    pub scraper: &'a mut dyn PerProcess,
    /// User-defined probes, when a spec is loaded.
    pub user_probes: &'a mut dyn PerProcess,
    /// GPU launches kept for the step join, and the process's kernel names.
    pub launches: &'a mut dyn PerProcess,
    /// The launch budget's per-process counts and pauses.
    pub budget: &'a mut dyn PerProcess,
    pub late: &'a mut LateAttach,
    /// Which processes have TLS library probes.
    pub tls: &'a mut dyn PerProcess,
    pub ipc: &'a mut IpcRouter,
    pub classifier: &'a mut FdClassifier,
    pub ports: &'a mut Ports,
    pub adoption: &'a mut Adoption,
    pub tracker: &'a mut Tracker,
    /// The join stage: the state the process's records are joined with (its engine metrics,
    /// its container and pod).
    pub join: &'a mut Join,
    pub records: &'a mut Vec<RequestRecord>,
}

impl Processes<'_> {
    /// Forgets `tgid` everywhere: capture and routing state first, then the tracker, whose open
    /// requests of the process end (cut by the server) and are handed to `sink`; the state
    /// those last records are joined with after that; the sink's own state last.
    pub(super) fn forget(&mut self, tgid: u32, sink: &mut dyn Sink) {
        let first: [&mut dyn PerProcess; 12] = [
            &mut *self.probes,
            &mut *self.tls,
            &mut *self.launches,
            &mut *self.budget,
            &mut *self.late,
            &mut *self.user_probes,
            &mut *self.scraper,
            &mut *self.ipc,
            &mut *self.classifier,
            &mut *self.ports,
            &mut *self.adoption,
            &mut *self.tracker,
        ];
        for state in first {
            state.process_gone(tgid);
        }
        self.tracker.take_ended(self.records);
        close(self.join, self.ipc, self.records, sink, false);
        self.join.process_gone(tgid);
        sink.on_process_gone(tgid);
    }
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Instant};

    use bytes::Bytes;
    use inferscope_common::SyscallKind;
    use inferscope_decode::http::Limits;

    use super::*;
    use crate::{
        capture::{
            SyscallEvent,
            metrics::Scrape,
            process::{adopt::ATTACH_WAIT, late_attach::Missing},
        },
        correlate::Peer,
        engines,
    };

    const HEAD: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: a\r\n\r\n";

    /// Stands in for a component that needs the kernel (probes) or a thread (scraper).
    #[derive(Default)]
    struct Gone(Vec<u32>);

    impl PerProcess for Gone {
        fn process_gone(&mut self, tgid: u32) {
            self.0.push(tgid);
        }
    }

    #[derive(Default)]
    struct Seen {
        records: Vec<RequestRecord>,
        gone: Vec<u32>,
    }

    impl Sink for Seen {
        fn on_timeline(&mut self, timeline: &std::sync::Arc<crate::join::RequestTimeline>) {
            self.records.push(timeline.request.clone());
        }
        fn on_process_gone(&mut self, tgid: u32) {
            self.gone.push(tgid);
        }
    }

    /// The pipeline's components, each holding something for a process.
    struct Parts {
        probes: Gone,
        scraper: Gone,
        user_probes: Gone,
        launches: Gone,
        budget: Gone,
        late: LateAttach,
        tls: Gone,
        ipc: IpcRouter,
        classifier: FdClassifier,
        ports: Ports,
        adoption: Adoption,
        tracker: Tracker,
        join: Join,
        records: Vec<RequestRecord>,
    }

    impl Parts {
        fn new() -> Self {
            Self {
                probes: Gone::default(),
                scraper: Gone::default(),
                user_probes: Gone::default(),
                launches: Gone::default(),
                budget: Gone::default(),
                late: LateAttach::default(),
                tls: Gone::default(),
                ipc: IpcRouter::default(),
                classifier: FdClassifier::new(true),
                ports: Ports::default(),
                adoption: Adoption::default(),
                tracker: Tracker::new(Limits::default()),
                join: Join::new(crate::join::TimelineLimits::default()),
                records: Vec::new(),
            }
        }

        fn processes(&mut self) -> Processes<'_> {
            Processes {
                probes: &mut self.probes,
                scraper: &mut self.scraper,
                user_probes: &mut self.user_probes,
                launches: &mut self.launches,
                budget: &mut self.budget,
                late: &mut self.late,
                tls: &mut self.tls,
                ipc: &mut self.ipc,
                classifier: &mut self.classifier,
                ports: &mut self.ports,
                adoption: &mut self.adoption,
                tracker: &mut self.tracker,
                join: &mut self.join,
                records: &mut self.records,
            }
        }

        /// What the pipeline keeps for `tgid` once it traces it (discovery attached it, or the
        /// kernel adopted it and its records came).
        fn trace(&mut self, tgid: u32) {
            let engine = "vllm";
            self.ports.insert(tgid, vec![8000]);
            self.tracker.set_engine(tgid, engine);
            self.ipc.add_process(tgid, engine);
            let peer: SocketAddr = ([127, 0, 0, 1], 40000).into();
            self.classifier.add_preexisting(tgid, 7, 8000, peer);
            let missing = Missing {
                engine,
                engine_hooks: vec![0],
                user_probes: Vec::new(),
                gpu_hooks: Vec::new(),
                tls_hooks: Vec::new(),
            };
            self.late.watch(tgid, missing, |_| true);
            let Some(endpoint) = engines::by_name(engine).and_then(|e| e.metrics()) else {
                panic!("vllm has a metrics endpoint");
            };
            self.join.on_scrape(&Scrape {
                pid: tgid,
                engine,
                endpoint,
                port: 8000,
                start_mono_ns: 1,
                end_mono_ns: 2,
                body: Bytes::from_static(b"vllm:num_requests_running 1\n"),
                failures_since_last: 0,
            });
            self.join.identify(tgid);
            // A request read, not answered yet: open when the process goes.
            let mut out = Vec::new();
            let read = SyscallEvent {
                kind: SyscallKind::Read,
                tgid,
                tid: tgid,
                fd: 5,
                ts_enter_ns: 10,
                ts_exit_ns: 10,
                ret: HEAD.len() as i64,
                truncated: false,
                copy_failed: false,
                conn_gen: 0,
                conn_flags: 0,
                sock: 0,
                conn_seq: None,
                read_seq: None,
                lost_heads: 0,
                payload: HEAD,
                more: false,
                chunk_offset: None,
                token: false,
            };
            self.tracker.on_read(&read, Peer::default(), &mut out);
            assert!(out.is_empty());
            assert_eq!(self.tracker.open_requests(), self.ports.len());
        }

        /// Every component that still holds something for `tgid`.
        fn holding(&self, tgid: u32) -> Vec<&'static str> {
            let mut holding = Vec::new();
            for (name, holds) in [
                ("probes", !self.probes.0.contains(&tgid)),
                ("scraper", !self.scraper.0.contains(&tgid)),
                ("user_probes", !self.user_probes.0.contains(&tgid)),
                ("late", self.late.watches(tgid)),
                ("tls", !self.tls.0.contains(&tgid)),
                ("ipc", self.ipc.wants(tgid)),
                ("classifier", self.classifier.knows_process(tgid)),
                ("ports", self.ports.contains_key(&tgid)),
                ("adoption", self.adoption.is_pending(tgid)),
                ("tracker", self.tracker.knows_process(tgid)),
            ] {
                if holds {
                    holding.push(name);
                }
            }
            holding.extend(self.join.holding(tgid));
            holding
        }
    }

    #[test]
    fn a_detached_process_is_forgotten_by_every_component() {
        let mut parts = Parts::new();
        let mut seen = Seen::default();
        parts.trace(41);
        parts.trace(42);
        assert!(parts.holding(42).len() >= 8, "{:?}", parts.holding(42));
        parts.processes().forget(42, &mut seen);
        assert_eq!(parts.holding(42), Vec::<&str>::new());
        assert_eq!(seen.gone, vec![42]);
        // Its open request was handed on, cut by the server.
        assert_eq!(seen.records.len(), 1);
        assert_eq!(seen.records[0].pid, 42);
        assert!(parts.records.is_empty());
        // The other process is untouched.
        assert!(parts.tracker.knows_process(41) && parts.ipc.wants(41));
        assert_eq!(parts.join.holding(41), ["engine_metrics", "identities"]);
    }

    #[test]
    fn a_given_up_adopted_process_is_forgotten_by_every_component() {
        let mut parts = Parts::new();
        let mut seen = Seen::default();
        let t0 = Instant::now();
        assert!(parts.adoption.adopted(43, t0));
        parts.trace(43);
        let given_up = parts.adoption.settle(t0 + ATTACH_WAIT, |_| false);
        assert_eq!(given_up, vec![43]);
        // Still pending for a process forgotten before it was given up (it exited first).
        assert!(parts.adoption.adopted(44, t0));
        parts.trace(44);
        for tgid in given_up.into_iter().chain([44]) {
            parts.processes().forget(tgid, &mut seen);
        }
        assert_eq!(parts.holding(43), Vec::<&str>::new());
        assert_eq!(parts.holding(44), Vec::<&str>::new());
        assert_eq!(seen.gone, vec![43, 44]);
        let pids: Vec<u32> = seen.records.iter().map(|r| r.pid).collect();
        assert_eq!(pids, vec![43, 44]);
    }
}
