//! Routes IPC sockets' bytes to the decoder of the engine that owns the process: one decoder per
//! engine kind (shared by its processes, since one request crosses the API server and the engine
//! core), created when discovery first finds a process of that engine.
//!
//! What the decoders learn is added to finished records through [`EngineWord`], by the join
//! stage, which also waits (bounded) for a word still to come: a client that leaves while its
//! request is still being tokenised ends the HTTP record before the API server has even handed
//! the request to its engine.
use inferscope_model::{Counter, RequestRecord, StepRecord};
use rustc_hash::FxHashMap;

use super::{EngineIpc, IpcBytes, IpcVerdict, by_name};

/// What the engines' own IPC tells of a finished request, for the join stage.
pub(crate) trait EngineWord {
    /// Whether the record's engine may still tell of its request (it has not yet).
    fn awaits_engine(&self, record: &RequestRecord) -> bool;
    /// Adds what the engine told (its stamps, token counts, steps) to the record.
    fn enrich(&mut self, record: &mut RequestRecord);
}

#[derive(Default)]
pub(crate) struct IpcRouter {
    decoders: FxHashMap<&'static str, Box<dyn EngineIpc>>,
    engine_of: FxHashMap<u32, &'static str>,
}

impl IpcRouter {
    pub(crate) fn add_process(&mut self, tgid: u32, engine: &'static str) {
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

    pub(crate) fn forget_process(&mut self, tgid: u32) {
        if let Some(engine) = self.engine_of.remove(&tgid)
            && let Some(decoder) = self.decoders.get_mut(engine)
        {
            decoder.forget_process(tgid);
        }
    }

    /// Whether `tgid`'s engine decodes IPC sockets.
    pub(crate) fn wants(&self, tgid: u32) -> bool {
        self.engine_of
            .get(&tgid)
            .is_some_and(|e| self.decoders.contains_key(e))
    }

    fn decoder(&mut self, tgid: u32) -> Option<&mut Box<dyn EngineIpc>> {
        let engine = self.engine_of.get(&tgid)?;
        self.decoders.get_mut(engine)
    }

    /// One captured syscall, which entered the kernel at `at_ns`.
    pub(crate) fn on_bytes(
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

    pub(crate) fn on_close(&mut self, tgid: u32, fd: i32) {
        if let Some(decoder) = self.decoder(tgid) {
            decoder.on_close(tgid, fd);
        }
    }

    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        self.decoders.values().flat_map(|d| d.counters()).collect()
    }
}

impl EngineWord for IpcRouter {
    fn awaits_engine(&self, record: &RequestRecord) -> bool {
        self.decoders
            .get(record.engine.as_str())
            .is_some_and(|d| d.awaits_engine(record))
    }

    fn enrich(&mut self, record: &mut RequestRecord) {
        if let Some(decoder) = self.decoders.get_mut(record.engine.as_str()) {
            decoder.enrich(record);
        }
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
}
