//! SGLang IPC messages (one pickled object per ZMQ message) → typed values, through the inert
//! pickle reader. Only ids, counts, finish reasons and times are read: prompt token ids are
//! counted from their byte length, prompt text is never kept.
use inferscope_decode::pickle::{self, PickleError, PickleLimits, Value};

use super::layout::Layout;

/// Longest rid accepted (SGLang's are 32 hex chars; users may pass their own).
const MAX_RID: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum IpcMessage {
    /// Tokenized requests, TokenizerManager → Scheduler.
    Add(Vec<AddRequest>),
    Abort {
        rid: Option<String>,
        all: bool,
    },
    /// One batch's outputs (one scheduler step); `scheduler` when the class is the one only the
    /// scheduler sends (BatchTokenIDOutput; the detokenizer forwards BatchStrOutput).
    Outputs {
        outputs: Vec<Output>,
        scheduler: bool,
    },
    /// Another SGLang object (health checks, weight updates, ...).
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct AddRequest {
    pub rid: String,
    pub prompt_tokens: Option<u64>,
}

/// One request's entry in a batched output (one scheduler step).
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Output {
    pub rid: String,
    pub finish_reason: Option<&'static str>,
    pub prompt_tokens: Option<u64>,
    /// Generated so far (cumulative).
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Times retracted so far (cumulative).
    pub retractions: Option<u64>,
    /// perf_counter() seconds (CLOCK_MONOTONIC) in the scheduler; None when not shipped.
    pub wait_queue_entry: Option<f64>,
    pub forward_entry: Option<f64>,
    pub prefill_finished: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    #[error(transparent)]
    Pickle(#[from] PickleError),
    /// Not a pickle (SGLANG_USE_PICKLE_IPC=0 sends msgpack, which is not decoded).
    #[error("not a pickle")]
    NotPickle,
    /// An SGLang IPC class without the fields this version's layout names.
    #[error("SGLang message does not match the pinned layout")]
    Layout,
}

impl DecodeError {
    /// The agent counter this failure is counted in.
    pub(super) fn counter(self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            Self::Pickle(e) => e.counter(),
            Self::NotPickle => Counter::SglangIpcNotPickle,
            Self::Layout => Counter::SglangIpcLayoutMismatch,
        }
    }
}

/// `rebuild(cls, fields)` of an io_struct class: (class name, fields).
fn io_struct<'v>(v: &'v Value, layout: &Layout) -> Option<(&'v str, &'v Value)> {
    let Value::Reduce(callable, args, _) = v else {
        return None;
    };
    if !callable.is_global(layout.rebuild.0, layout.rebuild.1) {
        return None;
    }
    let [class, fields] = args.items()? else {
        return None;
    };
    let Value::Global { module, name } = class else {
        return None;
    };
    (module == layout.io_struct && matches!(fields, Value::Dict(..)))
        .then_some((name.as_str(), fields))
}

pub(super) fn decode(frame: &[u8], layout: &Layout) -> Result<IpcMessage, DecodeError> {
    if frame.first() != Some(&0x80) {
        return Err(DecodeError::NotPickle);
    }
    let value = pickle::read(frame, &PickleLimits::default())?;
    let Some((class, fields)) = io_struct(&value, layout) else {
        return Ok(IpcMessage::Other);
    };
    if class == layout.request {
        return Ok(IpcMessage::Add(vec![request(fields)?]));
    }
    if class == layout.batch_request {
        let batch = fields
            .get("batch")
            .and_then(Value::items)
            .ok_or(DecodeError::Layout)?;
        let mut adds = Vec::with_capacity(batch.len().min(4096));
        for item in batch {
            match io_struct(item, layout) {
                Some((c, f)) if c == layout.request => adds.push(request(f)?),
                _ => return Err(DecodeError::Layout),
            }
        }
        return Ok(IpcMessage::Add(adds));
    }
    if layout.outputs.contains(&class) {
        return Ok(IpcMessage::Outputs {
            outputs: outputs(fields, layout)?,
            scheduler: class == layout.scheduler_output,
        });
    }
    if class == layout.abort {
        return Ok(IpcMessage::Abort {
            rid: fields.get("rid").and_then(rid),
            all: fields.get("abort_all") == Some(&Value::Bool(true)),
        });
    }
    Ok(IpcMessage::Other)
}

fn rid(v: &Value) -> Option<String> {
    v.as_str()
        .filter(|s| !s.is_empty() && s.len() <= MAX_RID)
        .map(str::to_owned)
}

fn request(fields: &Value) -> Result<AddRequest, DecodeError> {
    let rid = fields.get("rid").and_then(rid).ok_or(DecodeError::Layout)?;
    let ids = fields.get("input_ids").ok_or(DecodeError::Layout)?;
    Ok(AddRequest {
        rid,
        prompt_tokens: token_count(ids),
    })
}

/// Items in `array.array` (pickled as `_array_reconstructor(array, typecode, mformat, bytes)`)
/// or a list of token ids.
fn token_count(v: &Value) -> Option<u64> {
    if let Some(items) = v.items() {
        return Some(items.len() as u64);
    }
    let Value::Reduce(f, args, _) = v else {
        return None;
    };
    if !f.is_global("array", "_array_reconstructor") {
        return None;
    }
    let [_, _, mformat, Value::Bytes(len)] = args.items()? else {
        return None;
    };
    // CPython's machine format codes (Modules/arraymodule.c): 0-1 one byte, 2-5 two bytes,
    // 6-9 four, 10-13 eight.
    let size = match mformat.as_int()? {
        0..=1 => 1,
        2..=5 => 2,
        6..=9 => 4,
        10..=13 => 8,
        _ => return None,
    };
    len.is_multiple_of(size).then_some((*len / size) as u64)
}

/// A per-request list field of a batched output, `n` long (or absent/None).
fn column<'v>(fields: &'v Value, name: &str, n: usize) -> Result<Option<&'v [Value]>, DecodeError> {
    match fields.get(name) {
        None | Some(Value::None) => Ok(None),
        Some(v) => match v.items() {
            Some(items) if items.len() == n => Ok(Some(items)),
            _ => Err(DecodeError::Layout),
        },
    }
}

fn count(v: &Value) -> Option<u64> {
    v.as_int().and_then(|i| u64::try_from(i).ok())
}

fn finish_reason(v: &Value) -> Option<&'static str> {
    let kind = v.get("type")?.as_str()?;
    Some(match kind {
        "stop" => "stop",
        "length" => "length",
        "abort" => "abort",
        _ => "other",
    })
}

/// A time SGLang set (it leaves unset ones at 0.0).
fn time(state: &Value, name: &str) -> Option<f64> {
    state
        .get(name)
        .and_then(Value::as_float)
        .filter(|t| t.is_finite() && *t > 0.0)
}

fn outputs(fields: &Value, layout: &Layout) -> Result<Vec<Output>, DecodeError> {
    let rids = fields
        .get("rids")
        .and_then(Value::items)
        .ok_or(DecodeError::Layout)?;
    let n = rids.len();
    let reasons = column(fields, "finished_reasons", n)?.ok_or(DecodeError::Layout)?;
    let completion = column(fields, "completion_tokens", n)?.ok_or(DecodeError::Layout)?;
    let prompt = column(fields, "prompt_tokens", n)?;
    let cached = column(fields, "cached_tokens", n)?;
    let retractions = column(fields, "retraction_counts", n)?;
    let stats = column(fields, "time_stats", n)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let rid = rid(&rids[i]).ok_or(DecodeError::Layout)?;
        let at = |col: Option<&[Value]>| col.and_then(|c| count(&c[i]));
        let mut o = Output {
            rid,
            finish_reason: finish_reason(&reasons[i]),
            prompt_tokens: at(prompt),
            completion_tokens: count(&completion[i]),
            cached_tokens: at(cached),
            retractions: at(retractions),
            ..Default::default()
        };
        if let Some(stats) = stats {
            // copyreg: NEWOBJ(cls, ()) then BUILD(state) when the state is not empty.
            let (object, state) = match &stats[i] {
                Value::Build(object, state, _) => (&**object, Some(&**state)),
                other => (other, None),
            };
            let Value::NewObj(cls, _, _) = object else {
                return Err(DecodeError::Layout);
            };
            if !cls.is_global(layout.time_stats.0, layout.time_stats.1) {
                return Err(DecodeError::Layout);
            }
            if let Some(state) = state {
                o.wait_queue_entry = time(state, "wait_queue_entry_time");
                o.forward_entry = time(state, "forward_entry_time");
                o.prefill_finished = time(state, "prefill_finished_time");
            }
        }
        out.push(o);
    }
    Ok(out)
}
