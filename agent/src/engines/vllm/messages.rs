//! vLLM V1 IPC messages (msgpack frames of one ZMTP message) → typed values. Only ids, counts,
//! reasons and timestamps are read: prompt token ids are counted, never kept.
use inferscope_decode::msgpack::{Head, MsgpackError, Reader};

use super::layout::{self, Layout};

/// Longest request id accepted (vLLM's are ~50 bytes); longer is not vLLM's layout.
const MAX_ID: usize = 512;
/// Most outputs read from one EngineCoreOutputs (one per running request).
const MAX_OUTPUTS: u32 = 65_536;
/// Most events read per output (QUEUED, SCHEDULED, PREEMPTED... per step).
const MAX_EVENTS: u32 = 1024;
/// Most KV-transfer durations kept from one step's connector stats (NIXL reports one per
/// finished transfer handle); a step with more keeps none of them (see [`KvTransfers`]).
pub(super) const MAX_KV_TRANSFERS: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum IpcMessage {
    /// The engine's start-up message to the API server (EngineCoreReadyResponse).
    Ready {
        version: String,
    },
    Add(AddRequest),
    Abort {
        request_ids: Vec<String>,
    },
    Outputs(Outputs),
    /// A vLLM message the agent has no use for (utility calls, DP waves, ...).
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct AddRequest {
    /// The engine's id: `<external id>-<8 random chars>`.
    pub request_id: String,
    pub external_req_id: Option<String>,
    pub prompt_tokens: Option<u64>,
    /// Wall-clock seconds when the API server took the request.
    pub arrival_time: Option<f64>,
    /// The frame was cut off after the prompt's token count (a capture cut inside the prompt
    /// ids, or later): the fields after the cut are absent.
    pub partial: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Outputs {
    /// CLOCK_MONOTONIC seconds when the engine built this message (end of its step).
    pub timestamp: Option<f64>,
    /// The data-parallel rank of the engine core that sent it.
    pub engine_index: Option<i64>,
    pub outputs: Vec<Output>,
    pub stats: Option<SchedulerStats>,
    pub finished_requests: Vec<String>,
    /// The frame was cut off: `outputs` holds those read before the cut.
    pub partial: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Output {
    pub request_id: String,
    pub new_tokens: u32,
    pub finish_reason: Option<&'static str>,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EventKind {
    Queued,
    Scheduled,
    Preempted,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Event {
    pub kind: EventKind,
    /// CLOCK_MONOTONIC seconds (time.monotonic() in the engine).
    pub timestamp: f64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct SchedulerStats {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_cache_usage: Option<f64>,
    pub step_counter: Option<u64>,
    /// The KV connector's own transfer times reported with this step (`kv_connector_stats`).
    pub kv_transfers: KvTransfers,
}

/// What a step's `kv_connector_stats` (the connector's `KVConnectorStats.to_dict()`, sent in
/// SchedulerStats) says about the transfers its worker saw finish in that step. NIXL's dict has
/// `transfer_duration`: seconds per finished transfer handle, measured by the transfer agent
/// (post → done), in the order the loads were started; a MultiConnector nests one such dict
/// per connector. Nothing in it names a request.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) enum KvTransfers {
    /// No connector stats with transfer times in this step.
    #[default]
    None,
    /// Seconds per finished transfer, in the connector's order.
    Durations(Vec<f64>),
    /// More than [`MAX_KV_TRANSFERS`], a value no duration can be, or several connectors'
    /// lists at once: the step's transfers cannot be told apart.
    Unreadable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("msgpack: {0}")]
    Msgpack(#[from] MsgpackError),
    #[error("message does not match the pinned vLLM layout")]
    Layout,
    #[error("not a vLLM IPC message")]
    NotVllm,
}

impl DecodeError {
    /// The agent counter this failure is counted in.
    pub(super) fn counter(&self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            DecodeError::Msgpack(MsgpackError::Truncated) => Counter::VllmIpcTruncated,
            DecodeError::Msgpack(_) => Counter::VllmIpcBadMsgpack,
            DecodeError::Layout => Counter::VllmIpcLayoutMismatch,
            DecodeError::NotVllm => Counter::VllmIpcNotVllm,
        }
    }
}

/// Request types: the first frame of an API server → engine message.
const ADD: u8 = 0x00;
const ABORT: u8 = 0x01;

/// Decodes one multipart message (frame bodies; `complete` says whether the last one read was
/// whole). Input messages are `[type byte, msgpack...]`; the engine sends one msgpack frame
/// (plus out-of-band tensor frames, ignored).
pub(super) fn decode(frames: &[&[u8]], layout: &Layout) -> Result<IpcMessage, DecodeError> {
    let first = frames.first().ok_or(DecodeError::NotVllm)?;
    if let ([kind], Some(payload)) = (first, frames.get(1)) {
        return match *kind {
            ADD => decode_add(payload, layout).map(IpcMessage::Add),
            ABORT => decode_abort(payload),
            0x02..=0x05 => Ok(IpcMessage::Other),
            _ => Err(DecodeError::NotVllm),
        };
    }
    match first.first() {
        Some(0x80..=0x8f | 0xde | 0xdf) => decode_ready(first),
        Some(0x90..=0x9f | 0xdc | 0xdd) => decode_outputs(first, layout).map(IpcMessage::Outputs),
        _ => Err(DecodeError::NotVllm),
    }
}

fn id(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    let bytes = r.str().map_err(layout_on_type)?;
    if bytes.len() > MAX_ID {
        return Err(DecodeError::Layout);
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Layout)
}

fn layout_on_type(e: MsgpackError) -> DecodeError {
    match e {
        MsgpackError::Type => DecodeError::Layout,
        e => DecodeError::Msgpack(e),
    }
}

/// Skips the `n` elements of an array whose head was read; `Truncated` if they are cut off.
fn skip_n(r: &mut Reader<'_>, n: u32) -> Result<(), DecodeError> {
    for _ in 0..n {
        r.skip()?;
    }
    Ok(())
}

fn decode_ready(frame: &[u8]) -> Result<IpcMessage, DecodeError> {
    let mut r = Reader::new(frame);
    let n = r.map_len()?;
    for _ in 0..n {
        let key = r.str().map_err(layout_on_type)?;
        if key == b"vllm_version" {
            let v = r.str().map_err(layout_on_type)?;
            let version = std::str::from_utf8(v).map_err(|_| DecodeError::Layout)?;
            return Ok(IpcMessage::Ready {
                version: version.chars().take(64).collect(),
            });
        }
        r.skip()?;
    }
    Err(DecodeError::NotVllm)
}

fn decode_add(frame: &[u8], l: &Layout) -> Result<AddRequest, DecodeError> {
    let mut r = Reader::new(frame);
    let n = r.array_len().map_err(layout_on_type)?;
    if n > l.req_fields || n <= l.req_prompt_token_ids.max(l.req_request_id) {
        return Err(DecodeError::Layout);
    }
    let mut add = AddRequest {
        request_id: String::new(),
        external_req_id: None,
        prompt_tokens: None,
        arrival_time: None,
        partial: false,
    };
    let last = l
        .req_arrival_time
        .max(l.req_external_req_id)
        .max(l.req_prompt_token_ids);
    for i in 0..n.min(last + 1) {
        let step = (|| -> Result<(), DecodeError> {
            if i == l.req_request_id {
                add.request_id = id(&mut r)?;
            } else if i == l.req_prompt_token_ids {
                // Counted from the array header; the ids themselves are skipped, never kept.
                if let Some(count) = r.opt_array_len().map_err(layout_on_type)? {
                    add.prompt_tokens = Some(count as u64);
                    skip_n(&mut r, count)?;
                }
            } else if i == l.req_arrival_time {
                add.arrival_time = Some(r.float().map_err(layout_on_type)?);
            } else if i == l.req_external_req_id {
                if !r.nil()? {
                    add.external_req_id = Some(id(&mut r)?);
                }
            } else {
                r.skip()?;
            }
            Ok(())
        })();
        match step {
            Ok(()) => {}
            // A cut-off frame still gave the id and the prompt's length if it got that far:
            // the length is the ids array's header, so a cut inside the ids keeps it.
            Err(DecodeError::Msgpack(MsgpackError::Truncated))
                if !add.request_id.is_empty()
                    && (i > l.req_prompt_token_ids || add.prompt_tokens.is_some()) =>
            {
                add.partial = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if add.request_id.is_empty() {
        return Err(DecodeError::Layout);
    }
    Ok(add)
}

fn decode_abort(frame: &[u8]) -> Result<IpcMessage, DecodeError> {
    let mut r = Reader::new(frame);
    let n = r.array_len().map_err(layout_on_type)?;
    let mut request_ids = Vec::new();
    for _ in 0..n.min(MAX_OUTPUTS) {
        request_ids.push(id(&mut r)?);
    }
    Ok(IpcMessage::Abort { request_ids })
}

fn decode_outputs(frame: &[u8], l: &Layout) -> Result<Outputs, DecodeError> {
    let mut r = Reader::new(frame);
    let n = r.array_len()?;
    if n > l.outs_fields {
        return Err(DecodeError::Layout);
    }
    let mut outs = Outputs::default();
    for i in 0..n {
        let step = (|| -> Result<(), DecodeError> {
            if i == l.outs_outputs {
                let m = r.array_len().map_err(layout_on_type)?;
                if m > MAX_OUTPUTS {
                    return Err(DecodeError::Layout);
                }
                for _ in 0..m {
                    outs.outputs.push(decode_output(&mut r, l)?);
                }
            } else if i == l.outs_scheduler_stats {
                if !r.nil()? {
                    outs.stats = Some(decode_stats(&mut r)?);
                }
            } else if i == l.outs_engine_index {
                outs.engine_index = Some(r.int().map_err(layout_on_type)?);
            } else if i == l.outs_timestamp {
                outs.timestamp = Some(r.float().map_err(layout_on_type)?);
            } else if i == l.outs_finished_requests {
                if let Some(m) = r.opt_array_len().map_err(layout_on_type)? {
                    for _ in 0..m.min(MAX_OUTPUTS) {
                        outs.finished_requests.push(id(&mut r)?);
                    }
                }
            } else {
                r.skip()?;
            }
            Ok(())
        })();
        match step {
            Ok(()) => {}
            Err(DecodeError::Msgpack(MsgpackError::Truncated)) => {
                outs.partial = true;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(outs)
}

/// One EngineCoreOutput. The reader is left after it on success; on a cut-off the caller stops.
fn decode_output(r: &mut Reader<'_>, l: &Layout) -> Result<Output, DecodeError> {
    let k = r.array_len().map_err(layout_on_type)?;
    if k > l.out_fields || k <= l.out_new_token_ids.max(l.out_request_id) {
        return Err(DecodeError::Layout);
    }
    let mut out = Output {
        request_id: String::new(),
        new_tokens: 0,
        finish_reason: None,
        events: Vec::new(),
    };
    for i in 0..k {
        if i == l.out_request_id {
            out.request_id = id(r)?;
        } else if i == l.out_new_token_ids {
            let count = r.array_len().map_err(layout_on_type)?;
            skip_n(r, count)?;
            out.new_tokens = count;
        } else if i == l.out_finish_reason {
            if !r.nil()? {
                let code = r.int().map_err(layout_on_type)?;
                out.finish_reason = Some(layout::finish_reason(code).ok_or(DecodeError::Layout)?);
            }
        } else if i == l.out_events {
            if let Some(m) = r.opt_array_len().map_err(layout_on_type)? {
                if m > MAX_EVENTS {
                    return Err(DecodeError::Layout);
                }
                for _ in 0..m {
                    out.events.push(decode_event(r)?);
                }
            }
        } else {
            r.skip()?;
        }
    }
    Ok(out)
}

/// `{"type": 1|2|3, "timestamp": float}` — anything else is another layout.
fn decode_event(r: &mut Reader<'_>) -> Result<Event, DecodeError> {
    let n = r.map_len().map_err(layout_on_type)?;
    let (mut kind, mut timestamp) = (None, None);
    for _ in 0..n {
        let key = r.str().map_err(layout_on_type)?;
        match key {
            b"type" => {
                kind = Some(match r.int().map_err(layout_on_type)? {
                    1 => EventKind::Queued,
                    2 => EventKind::Scheduled,
                    3 => EventKind::Preempted,
                    _ => return Err(DecodeError::Layout),
                })
            }
            b"timestamp" => timestamp = Some(r.float().map_err(layout_on_type)?),
            _ => return Err(DecodeError::Layout),
        }
    }
    match (kind, timestamp) {
        (Some(kind), Some(timestamp)) => Ok(Event { kind, timestamp }),
        _ => Err(DecodeError::Layout),
    }
}

fn decode_stats(r: &mut Reader<'_>) -> Result<SchedulerStats, DecodeError> {
    let n = r.map_len().map_err(layout_on_type)?;
    let mut s = SchedulerStats::default();
    for _ in 0..n {
        let key = r.str().map_err(layout_on_type)?;
        let uint = |r: &mut Reader<'_>| -> Result<Option<u64>, DecodeError> {
            match r.head()? {
                Head::Int(v) => Ok(u64::try_from(v).ok()),
                _ => Err(DecodeError::Layout),
            }
        };
        match key {
            b"num_running_reqs" => s.running = uint(r)?,
            b"num_waiting_reqs" => s.waiting = uint(r)?,
            b"step_counter" => s.step_counter = uint(r)?,
            b"kv_cache_usage" => {
                let v = r.float().map_err(layout_on_type)?;
                s.kv_cache_usage = (v.is_finite() && (0.0..=1.0).contains(&v)).then_some(v);
            }
            b"kv_connector_stats" => s.kv_transfers = decode_connector_stats(r)?,
            _ => r.skip()?,
        }
    }
    Ok(s)
}

/// Longest duration accepted from connector stats (seconds); longer is not a transfer time.
const MAX_TRANSFER_S: f64 = 86_400.0;

/// `kv_connector_stats`: nil, a connector's dict, or a MultiConnector's dict of dicts. Any
/// shape other than NIXL's `transfer_duration` list is skipped (another connector's stats).
fn decode_connector_stats(r: &mut Reader<'_>) -> Result<KvTransfers, DecodeError> {
    if r.nil()? {
        return Ok(KvTransfers::None);
    }
    let mut found = KvTransfers::None;
    visit_connector_stats(r, 0, &mut found)?;
    Ok(found)
}

fn visit_connector_stats(
    r: &mut Reader<'_>,
    depth: u32,
    found: &mut KvTransfers,
) -> Result<(), DecodeError> {
    let n = match r.map_len() {
        Ok(n) => n,
        // Not a dict: another connector's stats shape.
        Err(MsgpackError::Type) => return Ok(r.skip()?),
        Err(e) => return Err(e.into()),
    };
    for _ in 0..n {
        let key = match r.str() {
            Ok(key) => key,
            Err(MsgpackError::Type) => {
                r.skip()?;
                r.skip()?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if key == b"transfer_duration" {
            let list = read_durations(r)?;
            *found = match (std::mem::take(found), list) {
                (KvTransfers::None, list) => list,
                (prev, KvTransfers::None) => prev,
                // Two connectors' lists in one step: whose transfer is whose is unknown.
                _ => KvTransfers::Unreadable,
            };
        } else if depth == 0 {
            // A MultiConnector's entry (one connector's dict), or a scalar of this one.
            visit_connector_stats(r, depth + 1, found)?;
        } else {
            r.skip()?;
        }
    }
    Ok(())
}

fn read_durations(r: &mut Reader<'_>) -> Result<KvTransfers, DecodeError> {
    let n = match r.opt_array_len() {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(KvTransfers::None),
        Err(MsgpackError::Type) => {
            r.skip()?;
            return Ok(KvTransfers::Unreadable);
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::with_capacity((n as usize).min(MAX_KV_TRANSFERS));
    let mut readable = n as usize <= MAX_KV_TRANSFERS;
    for _ in 0..n {
        match r.float() {
            Ok(v) if v.is_finite() && (0.0..=MAX_TRANSFER_S).contains(&v) => {
                if readable {
                    out.push(v);
                }
            }
            Ok(_) => readable = false,
            Err(MsgpackError::Type) => {
                r.skip()?;
                readable = false;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(match (readable, out.is_empty()) {
        (false, _) => KvTransfers::Unreadable,
        (true, true) => KvTransfers::None,
        (true, false) => KvTransfers::Durations(out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-written msgpack (vLLM's SchedulerStats is a map keyed by field name).
    fn s(text: &str) -> Vec<u8> {
        let mut out = vec![0xa0 | text.len() as u8];
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn f(v: f64) -> Vec<u8> {
        let mut out = vec![0xcb];
        out.extend_from_slice(&v.to_be_bytes());
        out
    }

    fn map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = vec![0x80 | entries.len() as u8];
        for (k, v) in entries {
            out.extend(s(k));
            out.extend_from_slice(v);
        }
        out
    }

    fn array(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![0x90 | items.len() as u8];
        for i in items {
            out.extend_from_slice(i);
        }
        out
    }

    fn stats(bytes: &[u8]) -> Result<SchedulerStats, DecodeError> {
        decode_stats(&mut Reader::new(bytes))
    }

    #[test]
    fn nixl_transfer_durations_are_read_from_the_scheduler_stats() {
        let nixl = map(&[
            ("transfer_duration", array(&[f(0.02), f(0.15)])),
            ("bytes_transferred", array(&[vec![0x01], vec![0x02]])),
            ("num_failed_transfers", array(&[])),
        ]);
        let got = stats(&map(&[
            ("num_running_reqs", vec![0x01]),
            ("kv_connector_stats", nixl.clone()),
            ("num_waiting_reqs", vec![0x03]),
        ]))
        .unwrap();
        assert_eq!(got.kv_transfers, KvTransfers::Durations(vec![0.02, 0.15]));
        assert_eq!((got.running, got.waiting), (Some(1), Some(3)));
        // A MultiConnector nests one dict per connector.
        let multi = map(&[
            ("NixlConnector", nixl),
            ("LMCacheConnectorV1", map(&[("x", array(&[vec![0x01]]))])),
        ]);
        let got = stats(&map(&[("kv_connector_stats", multi)])).unwrap();
        assert_eq!(got.kv_transfers, KvTransfers::Durations(vec![0.02, 0.15]));
        // None, an empty list and other connectors' shapes: no transfers.
        for empty in [
            vec![0xc0],
            map(&[("transfer_duration", array(&[]))]),
            s("text"),
            array(&[f(1.0)]),
        ] {
            let got = stats(&map(&[
                ("kv_connector_stats", empty),
                ("num_waiting_reqs", vec![0x02]),
            ]))
            .unwrap();
            assert_eq!(got.kv_transfers, KvTransfers::None);
            assert_eq!(got.waiting, Some(2));
        }
    }

    #[test]
    fn bad_durations_make_the_step_unreadable_not_the_message() {
        for bad in [
            array(&[f(0.1), f(-1.0)]),
            array(&[f(f64::NAN)]),
            array(&[f(0.1), array(&[f(0.2)])]),
            array(&[s("x")]),
            s("x"),
        ] {
            let got = stats(&map(&[
                ("kv_connector_stats", map(&[("transfer_duration", bad)])),
                ("num_waiting_reqs", vec![0x02]),
            ]))
            .unwrap();
            assert_eq!(got.kv_transfers, KvTransfers::Unreadable);
            assert_eq!(got.waiting, Some(2));
        }
        // Two connectors' lists in one step cannot be told apart.
        let two = map(&[
            ("a", map(&[("transfer_duration", array(&[f(0.1)]))])),
            ("b", map(&[("transfer_duration", array(&[f(0.2)]))])),
        ]);
        let got = stats(&map(&[("kv_connector_stats", two)])).unwrap();
        assert_eq!(got.kv_transfers, KvTransfers::Unreadable);
        // Too many to keep.
        let mut many = vec![0xdc];
        many.extend_from_slice(&((MAX_KV_TRANSFERS + 1) as u16).to_be_bytes());
        for _ in 0..=MAX_KV_TRANSFERS {
            many.extend(f(0.01));
        }
        let got = stats(&map(&[(
            "kv_connector_stats",
            map(&[("transfer_duration", many)]),
        )]))
        .unwrap();
        assert_eq!(got.kv_transfers, KvTransfers::Unreadable);
        // Cut off inside the list: the frame is truncated, never a panic.
        let whole = map(&[(
            "kv_connector_stats",
            map(&[("transfer_duration", array(&[f(0.1), f(0.2)]))]),
        )]);
        for cut in 0..whole.len() {
            let _ = stats(&whole[..cut]);
        }
        assert_eq!(
            stats(&whole[..whole.len() - 3]),
            Err(DecodeError::Msgpack(MsgpackError::Truncated))
        );
    }
}
