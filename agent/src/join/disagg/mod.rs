//! Stitches the two legs of a disaggregated (prefill/decode) request: the prefill server's
//! record and the decode server's, linked by the KV hand-off their bodies name (read by each
//! engine's module, [`crate::engines::Engine::disagg_leg`]). A prefill leg ends before its
//! decode leg starts (the proxy needs P's answer to call D), so prefill legs are remembered
//! and each decode leg looks its prefill leg up when it ends. A decode leg is joined only to a
//! prefill leg that returned exactly the hand-off it was sent, before it arrived, and only
//! once; otherwise it stays separate and says why.
use std::collections::VecDeque;

use inferscope_model::{
    Counter, DisaggInfo, DisaggLeg, DisaggRole, LegParse, RequestRecord, Stats, clock::ns_to_ms,
    disagg::fnv1a,
};
use rustc_hash::FxHashMap;

/// Prefill legs remembered; the oldest is forgotten (counted) beyond this.
const MAX_PREFILL_LEGS: usize = 16_384;
/// A prefill leg older than this (by the newest record's end) is forgotten: vLLM's NIXL
/// connector frees P's blocks after 480 s (VLLM_NIXL_ABORT_REQUEST_TIMEOUT) if D never reads.
const MAX_AGE_NS: u64 = 600 * 1_000_000_000;

#[derive(Debug, Clone)]
struct PrefillLeg {
    request_id: String,
    disagg_id: String,
    fingerprint: u64,
    arrival: u64,
    end: u64,
    queue_wait_ms: Option<f64>,
    prefill_ms: Option<f64>,
    joined: bool,
}

type Key = (&'static str, String);

#[derive(Debug, Default)]
pub(crate) struct Stitcher {
    prefill: FxHashMap<Key, Vec<PrefillLeg>>,
    /// Keys in the order their legs were remembered, with the leg's end.
    order: VecDeque<(u64, Key)>,
    legs: usize,
    newest_end: u64,
    /// The P/D proxy's records, joined to the decode legs they relayed.
    proxy: proxy::ProxyJoin,
    pub stats: Stats,
}

fn ms(from: u64, to: u64) -> f64 {
    ns_to_ms(to.saturating_sub(from))
}

/// The engine's queue wait and prefill of one leg: by the engine's own stamps where its IPC
/// gives them (queued → scheduled → first output), else the record's.
fn engine_phases(r: &RequestRecord) -> (Option<f64>, Option<f64>) {
    let queue = match (r.engine_queued_mono_ns, r.admitted_mono_ns) {
        (Some(q), Some(a)) if a >= q => Some(ms(q, a)),
        _ => r.queue_wait_ms,
    };
    let prefill = match (r.admitted_mono_ns, r.engine_first_output_mono_ns) {
        (Some(a), Some(f)) if f >= a => Some(ms(a, f)),
        _ => r.prefill_ms,
    };
    (queue, prefill)
}

impl Stitcher {
    /// Stitches one finished record: a leg at once (a decode leg is remembered for its
    /// proxy's record); a P/D proxy's record once its decode leg was seen. False: the record
    /// waits for its decode leg (try it again with [`Self::retry_proxy`]).
    pub(crate) fn stitch_record(&mut self, record: &mut RequestRecord) -> bool {
        self.stitch(record);
        if record.disagg.is_some() {
            self.proxy.decode_leg(record, &mut self.stats);
            return true;
        }
        self.proxy.proxy_record(record, &mut self.stats)
    }

    /// A proxy record that waits for its decode leg, tried again: true once it is done (with
    /// `give_up`, its wait is over and it goes unjoined if the leg is still unseen).
    pub(crate) fn retry_proxy(&mut self, record: &mut RequestRecord, give_up: bool) -> bool {
        self.proxy.retry(record, give_up, &mut self.stats)
    }

    /// Forgets decode legs no proxy record claimed in time (by the newest record's end).
    pub(crate) fn expire_decode_legs(&mut self) {
        self.proxy.expire(self.newest_end, &mut self.stats);
    }

    /// Reads `record`'s leg (if it is one) and fills its `disagg` view.
    fn stitch(&mut self, record: &mut RequestRecord) {
        self.newest_end = self.newest_end.max(record.end_mono_ns);
        self.expire();
        let Some(hints) = record.disagg_hints.take() else {
            return;
        };
        let Some(engine) = crate::engines::by_name(&record.engine) else {
            return;
        };
        match engine.disagg_leg(&hints) {
            LegParse::None => {}
            LegParse::Unjoinable(role, why) => self.unjoined(record, role, None, why),
            LegParse::Leg(leg) => match leg.role {
                DisaggRole::Prefill => self.remember(record, leg),
                DisaggRole::Decode => self.join(record, leg),
                // A proxy's record is no engine leg: no engine module reads one.
                DisaggRole::Proxy => {}
            },
        }
    }

    fn unjoined(
        &mut self,
        record: &mut RequestRecord,
        role: DisaggRole,
        scheme: Option<&'static str>,
        why: &'static str,
    ) {
        self.stats.bump(Counter::DisaggLegsUnjoined);
        record.disagg = Some(Box::new(DisaggInfo {
            role: Some(role),
            scheme,
            unjoined: Some(why),
            ..DisaggInfo::default()
        }));
    }

    fn remember(&mut self, record: &mut RequestRecord, leg: DisaggLeg) {
        let mut h = fnv1a(leg.scheme.as_bytes(), 0);
        h = fnv1a(leg.key.as_bytes(), h);
        h = fnv1a(record.request_id.as_bytes(), h);
        let disagg_id = format!("{h:016x}");
        let (queue_wait_ms, prefill_ms) = engine_phases(record);
        record.disagg = Some(Box::new(DisaggInfo {
            id: Some(disagg_id.clone()),
            role: Some(DisaggRole::Prefill),
            scheme: Some(leg.scheme),
            prefill_arrival_mono_ns: Some(record.arrival_mono_ns),
            prefill_queue_wait_ms: queue_wait_ms,
            prefill_ms,
            ..DisaggInfo::default()
        }));
        while self.legs >= MAX_PREFILL_LEGS {
            if !self.forget_oldest() {
                break;
            }
            self.stats.bump(Counter::DisaggPrefillLegsEvicted);
        }
        let key = (leg.scheme, leg.key);
        self.order.push_back((record.end_mono_ns, key.clone()));
        self.prefill.entry(key).or_default().push(PrefillLeg {
            request_id: record.request_id.clone(),
            disagg_id,
            fingerprint: leg.fingerprint,
            arrival: record.arrival_mono_ns,
            end: record.end_mono_ns,
            queue_wait_ms,
            prefill_ms,
            joined: false,
        });
        self.legs += 1;
    }

    /// Forgets the oldest remembered leg; false when none is left.
    fn forget_oldest(&mut self) -> bool {
        let Some((_, key)) = self.order.pop_front() else {
            return false;
        };
        if let Some(legs) = self.prefill.get_mut(&key) {
            if !legs.is_empty() {
                legs.remove(0);
                self.legs -= 1;
            }
            if legs.is_empty() {
                self.prefill.remove(&key);
            }
        }
        true
    }

    fn expire(&mut self) {
        while let Some(&(end, _)) = self.order.front() {
            if end.saturating_add(MAX_AGE_NS) >= self.newest_end {
                break;
            }
            let unread = self
                .order
                .front()
                .and_then(|(_, k)| self.prefill.get(k))
                .and_then(|legs| legs.first())
                .is_some_and(|l| !l.joined);
            self.forget_oldest();
            if unread {
                self.stats.bump(Counter::DisaggPrefillLegsEvicted);
            }
        }
    }

    fn join(&mut self, record: &mut RequestRecord, leg: DisaggLeg) {
        let arrival = record.arrival_mono_ns;
        let Some(legs) = self.prefill.get_mut(&(leg.scheme, leg.key)) else {
            return self.unjoined(
                record,
                DisaggRole::Decode,
                Some(leg.scheme),
                "prefill_leg_not_seen",
            );
        };
        let same: Vec<usize> = (0..legs.len())
            .filter(|&i| legs[i].fingerprint == leg.fingerprint)
            .collect();
        // D is sent what P answered: a D leg that arrived before P's answer ended was not.
        let in_time: Vec<usize> = same
            .iter()
            .copied()
            .filter(|&i| legs[i].end <= arrival)
            .collect();
        let why = match (same.len(), in_time.as_slice()) {
            (0, _) => Some("transfer_params_mismatch"),
            (_, []) => Some("before_prefill_response"),
            (_, [i]) if legs[*i].joined => Some("prefill_leg_already_joined"),
            (_, [_]) => None,
            _ => Some("prefill_leg_ambiguous"),
        };
        if let Some(why) = why {
            return self.unjoined(record, DisaggRole::Decode, Some(leg.scheme), why);
        }
        let p = &mut legs[in_time[0]];
        p.joined = true;
        let p = p.clone();
        self.stats.bump(Counter::DisaggLegsJoined);
        let kv_transfer_wait_ms = match (record.engine_queued_mono_ns, record.admitted_mono_ns) {
            (Some(q), Some(a)) if a >= q => Some(ms(q, a)),
            _ => None,
        };
        let first_decode_step_ms =
            match (record.admitted_mono_ns, record.engine_first_output_mono_ns) {
                (Some(a), Some(f)) if f >= a => Some(ms(a, f)),
                _ => None,
            };
        record.disagg = Some(Box::new(DisaggInfo {
            id: Some(p.disagg_id),
            role: Some(DisaggRole::Decode),
            scheme: Some(leg.scheme),
            peer_request_id: Some(p.request_id),
            unjoined: None,
            prefill_arrival_mono_ns: Some(p.arrival),
            prefill_queue_wait_ms: p.queue_wait_ms,
            prefill_ms: p.prefill_ms,
            handoff_ms: Some(ms(p.end, arrival)),
            kv_transfer_wait_ms,
            kv_transfer_ms: record.engine_kv_transfer_ms,
            kv_transfer_source: record
                .engine_kv_transfer_ms
                .and_then(|_| crate::engines::by_name(&record.engine))
                .and_then(|e| e.kv_transfer_source()),
            first_decode_step_ms,
            ttft_ms: record.first_token_mono_ns.map(|t| ms(p.arrival, t)),
            ..DisaggInfo::default()
        }));
    }

    pub(crate) fn counters(&self) -> Vec<(Counter, u64)> {
        self.stats.iter().collect()
    }
}

mod proxy;
#[cfg(test)]
mod tests;
