//! The proxy's (router's) own hop: the record of the client's request at a P/D proxy on the
//! node, joined to the decode leg whose stream it relayed. The proxy relays D's stream
//! unchanged, so its response's stream id (`response_id`, vLLM's `cmpl-<id>`) is the decode
//! leg's; the decode leg must also have arrived within the proxy's request (after the client's
//! request reached the proxy, before the proxy's answer ended), and its prefill leg after the
//! client's request reached the proxy. The proxy's record ends after the decode leg's (it
//! relays D's last bytes), so decode legs are remembered for it; a proxy record that comes
//! first (its decode leg held back for its engine's word) waits in the join's queue
//! (`join::waiting`) and is tried again until the leg comes or its wait ends.
use std::collections::VecDeque;

use inferscope_model::{Counter, DisaggInfo, DisaggRole, RequestRecord, Stats};
use rustc_hash::FxHashMap;

use super::ms;

/// Decode legs remembered for their proxy's record; the oldest is forgotten beyond this.
pub(super) const MAX_DECODE_LEGS: usize = 16_384;
/// How long (by the newest record's end) a decode leg waits for its proxy's record, which ends
/// just after it (the proxy relays D's last bytes, then ends its own answer).
pub(super) const DECODE_WAIT_NS: u64 = 30 * 1_000_000_000;

/// What a proxy record needs of a joined decode leg.
#[derive(Debug, Clone)]
struct DecodeLeg {
    request_id: String,
    arrival: u64,
    first_token: Option<u64>,
    /// The decode leg's stitched view (P's phases, the hand-off, the KV wait, D's first step).
    info: DisaggInfo,
    claimed: bool,
}

#[derive(Debug, Default)]
pub(super) struct ProxyJoin {
    /// Joined decode legs by their response's stream id.
    legs: FxHashMap<String, Vec<DecodeLeg>>,
    /// Stream ids in the order their legs were remembered, with the leg's end.
    order: VecDeque<(u64, String)>,
    count: usize,
    /// A P/D proxy's record was seen: decode legs no proxy record claims are then counted.
    proxy_seen: bool,
}

/// What became of a proxy record's join.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Joined,
    Unjoined(&'static str),
    /// No decode leg with its stream id yet.
    NotYet,
}

/// Whether `record` is a proxy's, and whether it is one by its kind (`pd_proxy`), not only by
/// what it relayed (a proxy a user claimed with a pattern, `custom`).
fn proxy_kind(record: &RequestRecord) -> bool {
    crate::engines::by_name(&record.engine).is_some_and(|e| e.pd_proxy())
}

impl ProxyJoin {
    /// Remembers a decode leg that was joined to its prefill leg, for the proxy record that
    /// relayed it (legs no proxy claimed are forgotten by [`Self::expire`]).
    pub(super) fn decode_leg(&mut self, record: &RequestRecord, stats: &mut Stats) {
        let (Some(info), Some(stream)) = (record.disagg.as_deref(), &record.response_id) else {
            return;
        };
        if info.role != Some(DisaggRole::Decode) || info.id.is_none() {
            return;
        }
        while self.count >= MAX_DECODE_LEGS {
            match self.forget_oldest() {
                Some(unclaimed) => {
                    if unclaimed && self.proxy_seen {
                        stats.bump(Counter::DisaggDecodeLegsEvicted);
                    }
                }
                None => break,
            }
        }
        self.order.push_back((record.end_mono_ns, stream.clone()));
        self.legs
            .entry(stream.clone())
            .or_default()
            .push(DecodeLeg {
                request_id: record.request_id.clone(),
                arrival: record.arrival_mono_ns,
                first_token: record.first_token_mono_ns,
                info: info.clone(),
                claimed: false,
            });
        self.count += 1;
    }

    /// A record that may be a proxy's: joined (true), or waiting for its decode leg (false,
    /// to be tried again with [`Self::retry`]). Records of other engines that relayed no
    /// decode leg pass unchanged.
    pub(super) fn proxy_record(&mut self, record: &mut RequestRecord, stats: &mut Stats) -> bool {
        let kind = proxy_kind(record);
        // A proxy's health checks and model lists are no client requests of a P/D pair.
        if record.method != "POST" || (!kind && record.engine != "custom") {
            return true;
        }
        let outcome = join(&mut self.legs, record);
        if !kind {
            // A user-claimed process is a proxy only where it relayed a decode leg.
            if outcome == Outcome::Joined {
                self.proxy_seen = true;
                stats.bump(Counter::DisaggProxyJoined);
            }
            return true;
        }
        self.proxy_seen = true;
        if outcome == Outcome::NotYet {
            return false;
        }
        self.count_outcome(outcome, record, stats);
        true
    }

    /// Tries a waiting proxy record again: true once it is done (joined, or unjoined for good;
    /// with `give_up`, its decode leg is taken as never seen).
    pub(super) fn retry(
        &mut self,
        record: &mut RequestRecord,
        give_up: bool,
        stats: &mut Stats,
    ) -> bool {
        match join(&mut self.legs, record) {
            Outcome::NotYet if !give_up => false,
            Outcome::NotYet => {
                self.unjoined(record, "decode_leg_not_seen", stats);
                true
            }
            outcome => {
                self.count_outcome(outcome, record, stats);
                true
            }
        }
    }

    fn count_outcome(&mut self, outcome: Outcome, record: &mut RequestRecord, stats: &mut Stats) {
        match outcome {
            Outcome::Joined => stats.bump(Counter::DisaggProxyJoined),
            Outcome::Unjoined(why) => self.unjoined(record, why, stats),
            Outcome::NotYet => {}
        }
    }

    fn unjoined(&mut self, record: &mut RequestRecord, why: &'static str, stats: &mut Stats) {
        stats.bump(Counter::DisaggProxyUnjoined);
        record.disagg = Some(Box::new(DisaggInfo {
            role: Some(DisaggRole::Proxy),
            unjoined: Some(why),
            proxy_arrival_mono_ns: Some(record.arrival_mono_ns),
            ..DisaggInfo::default()
        }));
    }

    /// Forgets the oldest remembered decode leg: whether it was unclaimed, None when none is
    /// left.
    fn forget_oldest(&mut self) -> Option<bool> {
        let (_, stream) = self.order.pop_front()?;
        let mut unclaimed = false;
        if let Some(legs) = self.legs.get_mut(&stream) {
            if !legs.is_empty() {
                unclaimed = !legs.remove(0).claimed;
                self.count -= 1;
            }
            if legs.is_empty() {
                self.legs.remove(&stream);
            }
        }
        Some(unclaimed)
    }

    /// Forgets decode legs no proxy record claimed in time: counted where a proxy is traced.
    pub(super) fn expire(&mut self, newest_end: u64, stats: &mut Stats) {
        while let Some(&(end, _)) = self.order.front() {
            if end.saturating_add(DECODE_WAIT_NS) >= newest_end {
                break;
            }
            if self.forget_oldest() == Some(true) && self.proxy_seen {
                stats.bump(Counter::DisaggLegsWithoutProxy);
            }
        }
    }
}

/// Joins a proxy record to the one decode leg it relayed, filling its `disagg` view.
fn join(legs: &mut FxHashMap<String, Vec<DecodeLeg>>, record: &mut RequestRecord) -> Outcome {
    let Some(stream) = record.response_id.as_deref() else {
        return Outcome::Unjoined("no_stream_id");
    };
    let Some(legs) = legs.get_mut(stream) else {
        return Outcome::NotYet;
    };
    let (start, end) = (record.arrival_mono_ns, record.end_mono_ns);
    // The proxy calls P, then D, after the client's request reached it, and ends its
    // answer after D's began.
    let within: Vec<usize> = (0..legs.len())
        .filter(|&i| {
            let l = &legs[i];
            l.arrival >= start
                && l.arrival <= end
                && l.info.prefill_arrival_mono_ns.is_some_and(|p| p >= start)
        })
        .collect();
    let open: Vec<usize> = within
        .iter()
        .copied()
        .filter(|&i| !legs[i].claimed)
        .collect();
    let i = match (within.len(), open.as_slice()) {
        (0, _) => return Outcome::NotYet,
        (_, []) => return Outcome::Unjoined("decode_leg_already_joined"),
        (_, [i]) => *i,
        _ => return Outcome::Unjoined("decode_leg_ambiguous"),
    };
    legs[i].claimed = true;
    let d = &legs[i];
    let first = record.first_token_mono_ns;
    record.disagg = Some(Box::new(DisaggInfo {
        role: Some(DisaggRole::Proxy),
        peer_request_id: Some(d.request_id.clone()),
        prefill_request_id: d.info.peer_request_id.clone(),
        unjoined: None,
        proxy_arrival_mono_ns: Some(start),
        proxy_to_prefill_ms: d.info.prefill_arrival_mono_ns.map(|p| ms(start, p)),
        relay_ms: match (d.first_token, first) {
            (Some(df), Some(pf)) if pf >= df => Some(ms(df, pf)),
            _ => None,
        },
        client_ttft_ms: first.map(|f| ms(start, f)),
        decode_arrival_mono_ns: Some(d.arrival),
        decode_first_token_mono_ns: d.first_token,
        ..d.info.clone()
    }));
    Outcome::Joined
}
