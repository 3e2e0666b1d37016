//! Routes IPC sockets' bytes to the decoder of the engine that owns the process: one decoder per
//! engine kind (shared by its processes, since one request crosses the API server and the engine
//! core), created when discovery first finds a process of that engine.
//!
//! A finished record whose engine may still speak of it is held back (bounded in number and
//! time) before the join: a client that leaves while its request is still being tokenised ends
//! the HTTP record before the API server has even handed the request to its engine.
use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use inferscope_model::{Counter, RequestRecord, Stats, StepRecord};
use rustc_hash::FxHashMap;

use super::{EngineIpc, IpcBytes, IpcVerdict, by_name};

/// Records held at once for a late engine join; beyond this a record is joined at once (counted).
const MAX_HELD: usize = 4096;
/// How long a record waits for its engine to tell what became of its request: vLLM's API
/// server forwards a request after tokenising it and its abort after that, tens of
/// milliseconds under load; a request the API server dropped before forwarding it is never told.
const HOLD: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct IpcRouter {
    decoders: FxHashMap<&'static str, Box<dyn EngineIpc>>,
    engine_of: FxHashMap<u32, &'static str>,
    /// Finished records waiting for their engine's word, oldest first, with when they came.
    held: VecDeque<(Instant, RequestRecord)>,
    stats: Stats,
}

impl IpcRouter {
    pub fn add_process(&mut self, tgid: u32, engine: &'static str) {
        self.engine_of.insert(tgid, engine);
        if !self.decoders.contains_key(engine)
            && let Some(decoder) = by_name(engine).and_then(|e| e.ipc())
        {
            self.decoders.insert(engine, decoder);
        }
        if let Some(decoder) = self.decoders.get_mut(engine) {
            decoder.add_process(tgid);
        }
    }

    pub fn forget_process(&mut self, tgid: u32) {
        if let Some(engine) = self.engine_of.remove(&tgid)
            && let Some(decoder) = self.decoders.get_mut(engine)
        {
            decoder.forget_process(tgid);
        }
    }

    /// Whether `tgid`'s engine decodes IPC sockets.
    pub fn wants(&self, tgid: u32) -> bool {
        self.engine_of
            .get(&tgid)
            .is_some_and(|e| self.decoders.contains_key(e))
    }

    fn decoder(&mut self, tgid: u32) -> Option<&mut Box<dyn EngineIpc>> {
        let engine = self.engine_of.get(&tgid)?;
        self.decoders.get_mut(engine)
    }

    /// One captured syscall, which entered the kernel at `at_ns`.
    pub fn on_bytes(
        &mut self,
        bytes: &IpcBytes<'_>,
        at_ns: u64,
        steps: &mut Vec<StepRecord>,
    ) -> IpcVerdict {
        match self.decoder(bytes.tgid) {
            Some(decoder) => decoder.on_bytes_at(bytes, at_ns, steps),
            None => IpcVerdict::NotIpc,
        }
    }

    pub fn on_close(&mut self, tgid: u32, fd: i32) {
        if let Some(decoder) = self.decoder(tgid) {
            decoder.on_close(tgid, fd);
        }
    }

    /// Adds what the record's engine's IPC knows to a finished HTTP record.
    pub fn enrich(&mut self, record: &mut RequestRecord) {
        if let Some(decoder) = self.decoders.get_mut(record.engine.as_str()) {
            decoder.enrich(record);
        }
    }

    fn awaits_engine(&self, record: &RequestRecord) -> bool {
        self.decoders
            .get(record.engine.as_str())
            .is_some_and(|d| d.awaits_engine(record))
    }

    /// Moves the finished `records` that are ready for the join into `ready`: those whose
    /// engine has nothing more to tell, and those held before that have waited long enough or
    /// whose engine has told since (all of them with `flush`, when the agent stops). The rest
    /// are held.
    pub fn ready_for_join(
        &mut self,
        records: impl IntoIterator<Item = RequestRecord>,
        now: Instant,
        flush: bool,
        ready: &mut Vec<RequestRecord>,
    ) {
        let mut i = 0;
        while i < self.held.len() {
            let (since, record) = &self.held[i];
            let expired = now.duration_since(*since) >= HOLD;
            if flush || expired || !self.awaits_engine(record) {
                if expired && !flush {
                    self.stats.bump(Counter::RecordsHeldForEngineUntold);
                }
                if let Some((_, record)) = self.held.remove(i) {
                    ready.push(record);
                }
            } else {
                i += 1;
            }
        }
        for record in records {
            if flush || !self.awaits_engine(&record) {
                ready.push(record);
            } else if self.held.len() >= MAX_HELD {
                self.stats.bump(Counter::RecordsHeldForEngineOverflow);
                ready.push(record);
            } else {
                self.stats.bump(Counter::RecordsHeldForEngine);
                self.held.push_back((now, record));
            }
        }
    }

    pub fn counters(&self) -> Vec<(Counter, u64)> {
        let mut all: Vec<(Counter, u64)> =
            self.decoders.values().flat_map(|d| d.counters()).collect();
        all.extend(self.stats.iter());
        all.push((Counter::RecordsHeldForEngineNow, self.held.len() as u64));
        all
    }
}

impl inferscope_model::PerProcess for IpcRouter {
    fn process_gone(&mut self, tgid: u32) {
        self.forget_process(tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::IpcDirection;

    #[test]
    fn only_processes_of_engines_with_ipc_are_routed() {
        let mut router = IpcRouter::default();
        router.add_process(1, "vllm");
        router.add_process(2, "llamacpp");
        assert!(router.wants(1));
        assert!(!router.wants(2));
        assert!(!router.wants(3));
        let bytes = |tgid| IpcBytes {
            tgid,
            tid: tgid,
            fd: 5,
            conn_gen: 0,
            direction: IpcDirection::Read,
            data: &[0xff, 0, 0],
            lost: 0,
        };
        let mut steps = Vec::new();
        assert_eq!(router.on_bytes(&bytes(1), 0, &mut steps), IpcVerdict::Keep);
        assert_eq!(
            router.on_bytes(&bytes(2), 0, &mut steps),
            IpcVerdict::NotIpc
        );
        router.forget_process(1);
        assert!(!router.wants(1));
    }

    #[test]
    fn records_awaiting_their_engine_are_held_bounded_in_time() {
        let mut router = IpcRouter::default();
        router.add_process(1, "vllm");
        let t0 = Instant::now();
        let record = |x: &str, aborted| RequestRecord {
            engine: "vllm".into(),
            x_request_id: Some(x.into()),
            aborted,
            ..Default::default()
        };
        let mut ready = Vec::new();
        router.ready_for_join(
            [record("gone", true), record("done", false)],
            t0,
            false,
            &mut ready,
        );
        let ids = |r: &[RequestRecord]| -> Vec<String> {
            r.iter().filter_map(|r| r.x_request_id.clone()).collect()
        };
        assert_eq!(ids(&ready), ["done"]);
        ready.clear();
        router.ready_for_join([], t0 + HOLD / 2, false, &mut ready);
        assert!(ready.is_empty());
        let gauge = |router: &IpcRouter| {
            router
                .counters()
                .into_iter()
                .find(|(c, _)| *c == Counter::RecordsHeldForEngineNow)
                .map(|(_, v)| v)
        };
        assert_eq!(gauge(&router), Some(1));
        router.ready_for_join([], t0 + HOLD, false, &mut ready);
        assert_eq!(ids(&ready), ["gone"]);
        assert_eq!(router.stats.get(Counter::RecordsHeldForEngineUntold), 1);
        assert_eq!(gauge(&router), Some(0));
        // Stopping hands over every record at once.
        ready.clear();
        router.ready_for_join([record("late", true)], t0, false, &mut ready);
        router.ready_for_join([record("last", true)], t0, true, &mut ready);
        assert_eq!(ids(&ready), ["late", "last"]);
        // Full: joined at once, counted.
        ready.clear();
        let many = (0..=MAX_HELD).map(|i| record(&format!("r{i}"), true));
        router.ready_for_join(many, t0, false, &mut ready);
        assert_eq!(ready.len(), 1);
        assert_eq!(router.stats.get(Counter::RecordsHeldForEngineOverflow), 1);
    }
}
