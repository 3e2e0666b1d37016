//! Minimal serde views of OpenAI-style request and completion JSON.
//!
//! Everything not needed is skipped with `IgnoredAny`, strings are measured
//! or borrowed rather than copied, and arrays are folded instead of
//! collected, so analysing a streamed token does not allocate.

use std::{borrow::Cow, fmt};

use serde::{
    Deserialize,
    de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor, value::MapAccessDeserializer},
};

use super::counts::{Timings, Usage};

/// Drains a map or sequence the visitor does not care about.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the scalar visitor methods of a "fold any JSON value into a
/// small summary" visitor with one fallback value.
macro_rules! scalar_fallbacks {
    ($fallback:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($fallback)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($fallback)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($fallback)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($fallback)
        }
    };
}

/// Whether a value is a non-empty string or a non-empty array: "this field
/// carries generated output". Null, missing and other types are false.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct NonEmpty(bool);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NonEmpty;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            scalar_fallbacks!(NonEmpty(false));
            fn visit_str<E>(self, v: &str) -> Result<NonEmpty, E> {
                Ok(NonEmpty(!v.is_empty()))
            }
            fn visit_unit<E>(self) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<NonEmpty, A::Error> {
                Ok(NonEmpty(drain_seq(seq)? > 0))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NonEmpty, A::Error> {
                drain_map(map)?;
                Ok(NonEmpty(false))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a value is present and not null (e.g. `finish_reason`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct NotNull(bool);

impl<'de> Deserialize<'de> for NotNull {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NotNull;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            scalar_fallbacks!(NotNull(true));
            fn visit_str<E>(self, _: &str) -> Result<NotNull, E> {
                Ok(NotNull(true))
            }
            fn visit_unit<E>(self) -> Result<NotNull, E> {
                Ok(NotNull(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<NotNull, A::Error> {
                drain_seq(seq)?;
                Ok(NotNull(true))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NotNull, A::Error> {
                drain_map(map)?;
                Ok(NotNull(true))
            }
        }
        d.deserialize_any(V)
    }
}

/// A count that tolerates negative (llama.cpp's `n_predict: -1`), float and
/// null values by mapping them to `None` instead of failing the document.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LenientU64(Option<u64>);

impl<'de> Deserialize<'de> for LenientU64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientU64;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a count")
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientU64, E> {
                Ok(LenientU64(None))
            }
            fn visit_u64<E>(self, v: u64) -> Result<LenientU64, E> {
                Ok(LenientU64(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<LenientU64, E> {
                Ok(LenientU64(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<LenientU64, E> {
                let ok = v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19;
                // Truncation is exact: v is integral and in range.
                Ok(LenientU64(ok.then_some(v as u64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<LenientU64, E> {
                Ok(LenientU64(None))
            }
            fn visit_unit<E>(self) -> Result<LenientU64, E> {
                Ok(LenientU64(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LenientU64, A::Error> {
                drain_seq(seq)?;
                Ok(LenientU64(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientU64, A::Error> {
                drain_map(map)?;
                Ok(LenientU64(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration/number that tolerates non-numbers by mapping them to `None`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct LenientF64(Option<f64>);

impl<'de> Deserialize<'de> for LenientF64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientF64;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_bool<E>(self, _: bool) -> Result<LenientF64, E> {
                Ok(LenientF64(None))
            }
            fn visit_u64<E>(self, v: u64) -> Result<LenientF64, E> {
                Ok(LenientF64(Some(v as f64)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<LenientF64, E> {
                Ok(LenientF64(Some(v as f64)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<LenientF64, E> {
                Ok(LenientF64(Some(v)))
            }
            fn visit_str<E>(self, _: &str) -> Result<LenientF64, E> {
                Ok(LenientF64(None))
            }
            fn visit_unit<E>(self) -> Result<LenientF64, E> {
                Ok(LenientF64(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<LenientF64, A::Error> {
                drain_seq(seq)?;
                Ok(LenientF64(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LenientF64, A::Error> {
                drain_map(map)?;
                Ok(LenientF64(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string that borrows from the input when it has no escapes (serde's
/// own `Cow` impl always copies). Non-strings become `None`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct LenientStr<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for LenientStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LenientStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            scalar_fallbacks!(LenientStr(None));
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(LenientStr(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(LenientStr(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(LenientStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(LenientStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(LenientStr(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// UTF-8 byte length of a string value (0 for anything else). serde_json
/// hands over the unescaped text in a reused scratch buffer; it is measured
/// and dropped, never kept.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct StrLen(u64);

impl<'de> Deserialize<'de> for StrLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            scalar_fallbacks!(StrLen(0));
            fn visit_str<E>(self, v: &str) -> Result<StrLen, E> {
                Ok(StrLen(v.len() as u64))
            }
            fn visit_unit<E>(self) -> Result<StrLen, E> {
                Ok(StrLen(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StrLen, A::Error> {
                drain_seq(seq)?;
                Ok(StrLen(0))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StrLen, A::Error> {
                drain_map(map)?;
                Ok(StrLen(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// Total text length of a string or an array of strings (`prompt`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct TextLen(u64);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("text or an array of text")
            }
            scalar_fallbacks!(TextLen(0));
            fn visit_str<E>(self, v: &str) -> Result<TextLen, E> {
                Ok(TextLen(v.len() as u64))
            }
            fn visit_unit<E>(self) -> Result<TextLen, E> {
                Ok(TextLen(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextLen, A::Error> {
                let mut sum = 0u64;
                while let Some(StrLen(n)) = seq.next_element()? {
                    sum = sum.saturating_add(n);
                }
                Ok(TextLen(sum))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TextLen, A::Error> {
                drain_map(map)?;
                Ok(TextLen(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// A content part (`{"type":"text","text":"…"}`); only `text` counts.
#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: StrLen,
}

/// Text length of one content part; a bare string counts as text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PartLen(u64);

impl<'de> Deserialize<'de> for PartLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content part")
            }
            scalar_fallbacks!(PartLen(0));
            fn visit_str<E>(self, v: &str) -> Result<PartLen, E> {
                Ok(PartLen(v.len() as u64))
            }
            fn visit_unit<E>(self) -> Result<PartLen, E> {
                Ok(PartLen(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<PartLen, A::Error> {
                drain_seq(seq)?;
                Ok(PartLen(0))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PartLen, A::Error> {
                let part = Part::deserialize(MapAccessDeserializer::new(map))?;
                Ok(PartLen(part.text.0))
            }
        }
        d.deserialize_any(V)
    }
}

/// Text length of a message `content`: a string or an array of parts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct ContentLen(u64);

impl<'de> Deserialize<'de> for ContentLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ContentLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("message content")
            }
            scalar_fallbacks!(ContentLen(0));
            fn visit_str<E>(self, v: &str) -> Result<ContentLen, E> {
                Ok(ContentLen(v.len() as u64))
            }
            fn visit_unit<E>(self) -> Result<ContentLen, E> {
                Ok(ContentLen(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ContentLen, A::Error> {
                let mut sum = 0u64;
                while let Some(PartLen(n)) = seq.next_element()? {
                    sum = sum.saturating_add(n);
                }
                Ok(ContentLen(sum))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ContentLen, A::Error> {
                drain_map(map)?;
                Ok(ContentLen(0))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: ContentLen,
}

/// Sum of all messages' content lengths, without collecting the array.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct MessagesLen(u64);

impl<'de> Deserialize<'de> for MessagesLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessagesLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessagesLen, A::Error> {
                let mut sum = 0u64;
                while let Some(Message { content }) = seq.next_element()? {
                    sum = sum.saturating_add(content.0);
                }
                Ok(MessagesLen(sum))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct RequestWire<'a> {
    #[serde(borrow, default)]
    model: LenientStr<'a>,
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: LenientU64,
    #[serde(default)]
    max_completion_tokens: LenientU64,
    #[serde(default)]
    n_predict: LenientU64,
    messages: Option<MessagesLen>,
    prompt: Option<TextLen>,
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    kv_transfer_params: super::handoff::Handoff,
}

/// What a request body says about the generation it asks for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RequestFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub max_tokens: Option<u64>,
    pub prompt_bytes: Option<u64>,
    pub include_usage: Option<bool>,
    /// `kv_transfer_params` (disaggregated serving), digested.
    pub kv_transfer_params: Option<inferscope_model::HandoffParams>,
}

/// Parses an OpenAI/llama.cpp request body; `None` if it is not such JSON.
pub(crate) fn parse_request(body: &[u8]) -> Option<RequestFields> {
    let w: RequestWire<'_> = serde_json::from_slice(body).ok()?;
    Some(RequestFields {
        model: w
            .model
            .0
            .map(|m| super::truncated_str(&m, super::MAX_NAME_BYTES).to_owned()),
        stream: w.stream,
        max_tokens: w
            .max_tokens
            .0
            .or(w.max_completion_tokens.0)
            .or(w.n_predict.0),
        prompt_bytes: w.messages.map(|m| m.0).or(w.prompt.map(|p| p.0)),
        include_usage: w.stream_options.and_then(|o| o.include_usage),
        kv_transfer_params: w.kv_transfer_params.0,
    })
}

/// Output-bearing fields of a delta (streaming) or message (non-streaming).
#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    reasoning_content: NonEmpty,
    #[serde(default)]
    reasoning: NonEmpty,
    #[serde(default)]
    tool_calls: NonEmpty,
}

impl Delta {
    fn has_content(&self) -> bool {
        self.content.0 || self.reasoning_content.0 || self.reasoning.0 || self.tool_calls.0
    }
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    message: Option<Delta>,
    #[serde(default)]
    text: NonEmpty,
    #[serde(default)]
    finish_reason: NotNull,
}

/// `choices` folded to two flags instead of collected into a Vec.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct ChoicesFlags {
    content: bool,
    finish: bool,
}

impl<'de> Deserialize<'de> for ChoicesFlags {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChoicesFlags;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ChoicesFlags, A::Error> {
                let mut flags = ChoicesFlags::default();
                while let Some(c) = seq.next_element::<Choice>()? {
                    flags.content |= c.text.0
                        || c.delta.as_ref().is_some_and(Delta::has_content)
                        || c.message.as_ref().is_some_and(Delta::has_content);
                    flags.finish |= c.finish_reason.0;
                }
                Ok(flags)
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default)]
    prompt_tokens: LenientU64,
    #[serde(default)]
    completion_tokens: LenientU64,
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: LenientU64,
}

#[derive(Deserialize)]
struct TimingsWire {
    #[serde(default)]
    prompt_n: LenientU64,
    #[serde(default)]
    prompt_ms: LenientF64,
    #[serde(default)]
    predicted_n: LenientU64,
    #[serde(default)]
    predicted_ms: LenientF64,
    /// llama.cpp: prompt tokens reused from the slot's cache.
    #[serde(default)]
    cache_n: LenientU64,
}

#[derive(Deserialize)]
struct CompletionWire<'a> {
    #[serde(borrow, default)]
    id: LenientStr<'a>,
    choices: Option<ChoicesFlags>,
    usage: Option<UsageWire>,
    timings: Option<TimingsWire>,
    /// llama.cpp's native /completion and /infill: `{"content": "…", "stop": false}` per
    /// token, `stop: true` and the token counts on the last event.
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    stop: Option<bool>,
    #[serde(default)]
    tokens_predicted: LenientU64,
    #[serde(default)]
    tokens_evaluated: LenientU64,
    #[serde(default)]
    tokens_cached: LenientU64,
    /// A vLLM prefill server's hand-off for the decode server.
    #[serde(default)]
    kv_transfer_params: super::handoff::Handoff,
    /// Ollama's NDJSON lines: `{"response": "…", "done": false}` (/api/generate) or
    /// `{"message": {"content": "…"}}` (/api/chat) per token; `done: true` with the token
    /// counts and durations (ns) on the last line.
    #[serde(default)]
    response: NonEmpty,
    message: Option<Delta>,
    #[serde(default)]
    done: Option<bool>,
    #[serde(default)]
    prompt_eval_count: LenientU64,
    #[serde(default)]
    eval_count: LenientU64,
    #[serde(default)]
    prompt_eval_duration: LenientU64,
    #[serde(default)]
    eval_duration: LenientU64,
}

/// What one completion document (SSE event data or whole body) reports.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct CompletionFields<'a> {
    /// Borrowed from the input unless it contained escapes.
    pub id: Option<Cow<'a, str>>,
    pub content: bool,
    pub finish: bool,
    pub usage: Option<Usage>,
    pub timings: Option<Timings>,
    pub kv_transfer_params: Option<inferscope_model::HandoffParams>,
}

/// Parses a chat/completions chunk or response; `None` if it is not JSON of
/// that shape.
pub(crate) fn parse_completion(data: &[u8]) -> Option<CompletionFields<'_>> {
    let w: CompletionWire<'_> = serde_json::from_slice(data).ok()?;
    let choices = w.choices.unwrap_or_default();
    let native_usage = (w.tokens_predicted.0.is_some() || w.tokens_evaluated.0.is_some())
        .then_some(Usage {
            prompt_tokens: w.tokens_evaluated.0,
            completion_tokens: w.tokens_predicted.0,
            cached_tokens: w.tokens_cached.0,
        });
    let ollama_usage =
        (w.eval_count.0.is_some() || w.prompt_eval_count.0.is_some()).then_some(Usage {
            prompt_tokens: w.prompt_eval_count.0,
            completion_tokens: w.eval_count.0,
            cached_tokens: None,
        });
    let ns_to_ms = |ns: Option<u64>| ns.map(|ns| ns as f64 / 1e6);
    let ollama_timings = (w.eval_duration.0.is_some() || w.prompt_eval_duration.0.is_some())
        .then_some(Timings {
            prompt_n: w.prompt_eval_count.0,
            prompt_ms: ns_to_ms(w.prompt_eval_duration.0),
            predicted_n: w.eval_count.0,
            predicted_ms: ns_to_ms(w.eval_duration.0),
        });
    let cache_n = w.timings.as_ref().and_then(|t| t.cache_n.0);
    Some(CompletionFields {
        id: w.id.0,
        content: choices.content
            || w.content.0
            || w.response.0
            || w.message.as_ref().is_some_and(Delta::has_content),
        finish: choices.finish || w.stop == Some(true) || w.done == Some(true),
        usage: w
            .usage
            .map(|u| Usage {
                prompt_tokens: u.prompt_tokens.0,
                completion_tokens: u.completion_tokens.0,
                cached_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens.0)
                    .or(cache_n),
            })
            .or(native_usage)
            .or(ollama_usage),
        timings: w
            .timings
            .map(|t| Timings {
                prompt_n: t.prompt_n.0,
                prompt_ms: t.prompt_ms.0,
                predicted_n: t.predicted_n.0,
                predicted_ms: t.predicted_ms.0,
            })
            .or(ollama_timings),
        kv_transfer_params: w.kv_transfer_params.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_chat_with_parts_and_escapes() {
        let body = br#"{"model":"llama-3","stream":true,"max_completion_tokens":64,
            "stream_options":{"include_usage":true},
            "messages":[{"role":"system","content":"h\u00e9\n"},
                        {"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]},
                        {"role":"assistant","content":null,"tool_calls":[]}]}"#;
        let f = parse_request(body).unwrap();
        assert_eq!(f.model.as_deref(), Some("llama-3"));
        assert_eq!(f.stream, Some(true));
        assert_eq!(f.max_tokens, Some(64));
        // "hé\n" is 4 UTF-8 bytes, "abc" 3.
        assert_eq!(f.prompt_bytes, Some(7));
        assert_eq!(f.include_usage, Some(true));
    }

    #[test]
    fn llama_cpp_native_completion_events() {
        let token = br#"{"index":0,"content":" Paris","tokens":[6342],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":9}"#;
        let f = parse_completion(token).unwrap();
        assert!(f.content && !f.finish);
        let last = br#"{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"m","tokens_predicted":8,"tokens_evaluated":9,"timings":{"prompt_n":9,"prompt_ms":4.5,"predicted_n":8,"predicted_ms":80.0}}"#;
        let f = parse_completion(last).unwrap();
        assert!(!f.content && f.finish);
        assert_eq!(
            f.usage,
            Some(Usage {
                prompt_tokens: Some(9),
                completion_tokens: Some(8),
                cached_tokens: None,
            })
        );
        assert_eq!(f.timings.unwrap().prompt_ms, Some(4.5));
    }

    #[test]
    fn request_completion_prompt_forms() {
        let f = parse_request(br#"{"prompt":"hello","n_predict":-1}"#).unwrap();
        assert_eq!((f.prompt_bytes, f.max_tokens), (Some(5), None));
        let f =
            parse_request(br#"{"prompt":["ab","cd",[1,2]],"max_tokens":3,"n_predict":9}"#).unwrap();
        assert_eq!((f.prompt_bytes, f.max_tokens), (Some(4), Some(3)));
        let f = parse_request(br#"{"n_predict":7.0}"#).unwrap();
        assert_eq!((f.prompt_bytes, f.max_tokens), (None, Some(7)));
        assert_eq!(parse_request(b"{not json"), None);
        assert_eq!(parse_request(b"[1]"), None);
        let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(300));
        assert_eq!(
            parse_request(long.as_bytes()).unwrap().model.unwrap().len(),
            128
        );
    }

    #[test]
    fn completion_content_rules() {
        let role_only = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"id":"chatcmpl-XYZ"}"#;
        let f = parse_completion(role_only).unwrap();
        assert!(!f.content && !f.finish);
        assert!(matches!(f.id, Some(Cow::Borrowed("chatcmpl-XYZ"))));

        for data in [
            &br#"{"choices":[{"delta":{"content":"Hi"}}]}"#[..],
            br#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#,
            br#"{"choices":[{"text":"x","finish_reason":null}]}"#,
            br#"{"choices":[{"message":{"role":"assistant","content":"ok"}}]}"#,
            br#"{"choices":[{"delta":{}},{"delta":{"content":"\u00e9"}}]}"#,
        ] {
            assert!(
                parse_completion(data).unwrap().content,
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        for data in [
            &br#"{"choices":[{"delta":{"content":""}}]}"#[..],
            br#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            br#"{"choices":[{"text":""}]}"#,
            br#"{"choices":[]}"#,
            br#"{"choices":null,"usage":null}"#,
            br#"{"error":{"message":"boom"}}"#,
        ] {
            assert!(
                !parse_completion(data).unwrap().content,
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        assert!(
            parse_completion(br#"{"choices":[{"finish_reason":"stop","delta":{}}]}"#)
                .unwrap()
                .finish
        );
        assert_eq!(parse_completion(b"[DONE]"), None);
    }

    #[test]
    fn usage_and_timings() {
        let data = br#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"usage":{"completion_tokens":8,"prompt_tokens":20,"total_tokens":28},"timings":{"prompt_n":20,"prompt_ms":12.5,"prompt_per_token_ms":0.6,"predicted_n":8,"predicted_ms":100.1}}"#;
        let f = parse_completion(data).unwrap();
        assert_eq!(
            f.usage,
            Some(Usage {
                prompt_tokens: Some(20),
                completion_tokens: Some(8),
                cached_tokens: None,
            })
        );
        assert_eq!(
            f.timings,
            Some(Timings {
                prompt_n: Some(20),
                prompt_ms: Some(12.5),
                predicted_n: Some(8),
                predicted_ms: Some(100.1)
            })
        );
        assert!(f.finish);
    }

    /// The proxy's request to a vLLM decode server: P's hand-off, forwarded; the prompt is
    /// still only measured, and the block ids only digested.
    #[test]
    fn request_with_transfer_params() {
        let f = parse_request(
            br#"{"model":"m","prompt":"hello","max_tokens":8,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"cmpl-1-0-abcdefgh","remote_block_ids":[1,2],"prompt_token_ids":[7,7,7]}}"#,
        )
        .unwrap();
        assert_eq!((f.prompt_bytes, f.max_tokens), (Some(5), Some(8)));
        let p = f.kv_transfer_params.unwrap();
        assert_eq!(p.bool("do_remote_prefill"), Some(true));
        assert_eq!(p.str("remote_request_id"), Some("cmpl-1-0-abcdefgh"));
        assert!(matches!(
            p.get("prompt_token_ids"),
            Some(inferscope_model::HandoffValue::Digest { len: 3, .. })
        ));
        // Not an object: no hand-off, the rest of the request still reads.
        let f = parse_request(br#"{"prompt":"x","kv_transfer_params":null}"#).unwrap();
        assert_eq!((f.prompt_bytes, f.kv_transfer_params), (Some(1), None));
    }

    #[test]
    fn ollama_lines() {
        let token = parse_completion(br#"{"model":"m","response":"Hi","done":false}"#).unwrap();
        assert!(token.content && !token.finish && token.usage.is_none());
        let chat =
            parse_completion(br#"{"message":{"role":"assistant","content":"x"},"done":false}"#)
                .unwrap();
        assert!(chat.content);
        let last = parse_completion(
            br#"{"response":"","done":true,"prompt_eval_count":26,"eval_count":290,
                "prompt_eval_duration":130079000,"eval_duration":4232710000}"#,
        )
        .unwrap();
        assert!(!last.content && last.finish);
        assert_eq!(
            last.usage,
            Some(Usage {
                prompt_tokens: Some(26),
                completion_tokens: Some(290),
                cached_tokens: None,
            })
        );
        let t = last.timings.unwrap();
        assert_eq!((t.prompt_n, t.predicted_n), (Some(26), Some(290)));
        assert!((t.prompt_ms.unwrap() - 130.079).abs() < 1e-9);
    }

    /// llama.cpp's last event (as its server sends it): the prefix cache's share of the prompt
    /// in `usage.prompt_tokens_details` and again in `timings.cache_n`.
    #[test]
    fn cached_prompt_tokens() {
        let last = br#"{"choices":[],"id":"chatcmpl-4n","object":"chat.completion.chunk","usage":{"completion_tokens":4,"prompt_tokens":201,"total_tokens":205,"prompt_tokens_details":{"cached_tokens":194}},"timings":{"cache_n":194,"prompt_n":7,"prompt_ms":64.942,"predicted_n":4,"predicted_ms":62.136}}"#;
        let u = parse_completion(last).unwrap().usage.unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (Some(201), Some(194)));
        let timings_only =
            br#"{"usage":{"prompt_tokens":50,"completion_tokens":2},"timings":{"cache_n":40}}"#;
        let u = parse_completion(timings_only).unwrap().usage.unwrap();
        assert_eq!(u.cached_tokens, Some(40));
        let none = br#"{"usage":{"prompt_tokens":50,"completion_tokens":2}}"#;
        assert_eq!(
            parse_completion(none).unwrap().usage.unwrap().cached_tokens,
            None
        );
    }
}
