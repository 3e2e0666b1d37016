//! vLLM V1 IPC messages (msgpack frames of one ZMTP message) → typed values. Only ids, counts,
//! reasons and timestamps are read: prompt token ids are counted, never kept.
use super::layout::{self, Layout};
use crate::decode::msgpack::{Head, MsgpackError, Reader};

/// Longest request id accepted (vLLM's are ~50 bytes); longer is not vLLM's layout.
const MAX_ID: usize = 512;
/// Most outputs read from one EngineCoreOutputs (one per running request).
const MAX_OUTPUTS: u32 = 65_536;
/// Most events read per output (QUEUED, SCHEDULED, PREEMPTED... per step).
const MAX_EVENTS: u32 = 1024;

#[derive(Debug, Clone, PartialEq)]
pub enum IpcMessage {
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
pub struct AddRequest {
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
pub struct Outputs {
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
pub struct Output {
    pub request_id: String,
    pub new_tokens: u32,
    pub finish_reason: Option<&'static str>,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Queued,
    Scheduled,
    Preempted,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    /// CLOCK_MONOTONIC seconds (time.monotonic() in the engine).
    pub timestamp: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SchedulerStats {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_cache_usage: Option<f64>,
    pub step_counter: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("msgpack: {0}")]
    Msgpack(#[from] MsgpackError),
    #[error("message does not match the pinned vLLM layout")]
    Layout,
    #[error("not a vLLM IPC message")]
    NotVllm,
}

impl DecodeError {
    /// The agent counter this failure is counted in.
    pub fn counter(&self) -> crate::model::Counter {
        use crate::model::Counter;

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
pub fn decode(frames: &[&[u8]], layout: &Layout) -> Result<IpcMessage, DecodeError> {
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
            _ => r.skip()?,
        }
    }
    Ok(s)
}
