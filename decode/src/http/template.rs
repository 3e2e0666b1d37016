//! What one streamed token event of a connection looks like, learned from events decoded in
//! full, so capture can recognise the next ones without copying them (see
//! `docs/src/token-events.md`). A template is the event's chunk data around its token text:
//! `prefix` up to and including the text's opening quote, `suffix` from its closing quote to
//! the end of the event. Bytes that differ between responses (ids, timestamps) are left free by
//! the mask; everything else must match exactly.

use super::sse::{EventFramer, RawEvent};

/// Longest prefix or suffix a template may have (the kernel's `TEMPLATE_BYTES`).
pub const TEMPLATE_SIDE_MAX: usize = 256;
/// Longest token text the kernel checks (the kernel's `TOKEN_TEXT_MAX`).
pub const TOKEN_TEXT_MAX: usize = 64;

/// Where the token text of a chat or completions event begins.
const TEXT_KEYS: [&[u8]; 2] = [b"\"content\":\"", b"\"text\":\""];

/// One connection's token event shape. Mask bytes: 0xff must match, 0 is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTemplate {
    pub prefix: Vec<u8>,
    pub prefix_mask: Vec<u8>,
    pub suffix: Vec<u8>,
    pub suffix_mask: Vec<u8>,
}

/// What merging a newly learned template into the installed one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// The new event fits the template as it is.
    Same,
    /// Bytes that differ between the two (ids, timestamps) are now free.
    Widened,
    /// The shapes differ (lengths, structure): the new one replaces the old.
    Replaced,
}

impl TokenTemplate {
    /// The template of one event's chunk data (`data: {...}\n\n`), when it has exactly one
    /// token text of 1 to [`TOKEN_TEXT_MAX`] bytes, both sides fit, and the same event with
    /// any other quote-free text still decodes as one content event without a finish, usage
    /// or timings (checked here with the decoder itself, so the kernel never summarises an
    /// event whose fields matter).
    pub(crate) fn learn(data: &[u8]) -> Option<Self> {
        let mut found = None;
        for key in TEXT_KEYS {
            let mut from = 0;
            while let Some(at) = data
                .get(from..)
                .and_then(|rest| memchr::memmem::find(rest, key))
            {
                if found.is_some() {
                    return None; // two candidate texts: ambiguous
                }
                found = Some(from + at + key.len());
                from += at + key.len();
            }
        }
        let start = found?;
        let len = memchr::memchr(b'"', data.get(start..)?)?;
        let end = start + len;
        let text = data.get(start..end)?;
        // An escaped quote would end the text elsewhere; a backslash before the closing quote
        // may be one.
        if text.is_empty() || len > TOKEN_TEXT_MAX || text.contains(&b'\\') {
            return None;
        }
        let prefix = data.get(..start)?;
        let suffix = data.get(end..)?;
        if prefix.len() > TEMPLATE_SIDE_MAX || suffix.len() > TEMPLATE_SIDE_MAX {
            return None;
        }
        let template = Self {
            prefix: prefix.to_vec(),
            prefix_mask: vec![0xff; prefix.len()],
            suffix: suffix.to_vec(),
            suffix_mask: vec![0xff; suffix.len()],
        };
        template.decodes_as_token(b"x").then_some(template)
    }

    /// Folds `other` (learned from a later event) in: positions where both hold different
    /// letters or digits inside a JSON string value or number (ids, timestamps, indexes)
    /// become free; any other difference (a key, a literal such as `null`, structure, a
    /// length) replaces the template.
    pub fn merge(&mut self, other: &Self) -> Merge {
        // The common case, an event the template already fits, without the JSON walk.
        if self.fits(other) {
            return Merge::Same;
        }
        let widened = match (
            merged_side(&self.prefix, &self.prefix_mask, &other.prefix, 0),
            // The suffix begins with the text's closing quote.
            merged_side(&self.suffix, &self.suffix_mask, &other.suffix, 1),
        ) {
            (Some(prefix_mask), Some(suffix_mask)) => {
                let changed = prefix_mask != self.prefix_mask || suffix_mask != self.suffix_mask;
                self.prefix_mask = prefix_mask;
                self.suffix_mask = suffix_mask;
                changed
            }
            _ => {
                *self = other.clone();
                return Merge::Replaced;
            }
        };
        if widened { Merge::Widened } else { Merge::Same }
    }

    /// Whether `other`'s bytes match this template wherever its mask holds.
    fn fits(&self, other: &Self) -> bool {
        let side = |bytes: &[u8], mask: &[u8], other: &[u8]| {
            bytes.len() == other.len()
                && bytes
                    .iter()
                    .zip(mask)
                    .zip(other)
                    .all(|((a, m), b)| (a ^ b) & m == 0)
        };
        side(&self.prefix, &self.prefix_mask, &other.prefix)
            && side(&self.suffix, &self.suffix_mask, &other.suffix)
    }

    /// Whether the event with `text` in place decodes as one content event and nothing else.
    fn decodes_as_token(&self, text: &[u8]) -> bool {
        let mut data = Vec::with_capacity(self.prefix.len() + text.len() + self.suffix.len());
        data.extend_from_slice(&self.prefix);
        data.extend_from_slice(text);
        data.extend_from_slice(&self.suffix);
        let mut framer = EventFramer::default();
        let mut events = 0;
        let mut token = false;
        let fed = framer.feed(&data, data.len() + 1, |raw| {
            events += 1;
            token = match raw {
                RawEvent::Data(d) => super::json::parse_completion(d).is_some_and(|f| {
                    f.content && !f.finish && f.usage.is_none() && f.timings.is_none()
                }),
                RawEvent::Corrupt => false,
            };
        });
        fed.is_ok() && events == 1 && token && framer.is_idle()
    }

    /// Whether `data` (one chunk's data) is an event of this template: what the kernel checks.
    #[cfg(any(test, feature = "test-support"))]
    pub fn matches(&self, data: &[u8]) -> bool {
        let fixed = self.prefix.len() + self.suffix.len();
        let Some(text_len) = data.len().checked_sub(fixed) else {
            return false;
        };
        let side_matches = |bytes: &[u8], template: &[u8], mask: &[u8]| {
            bytes
                .iter()
                .zip(template.iter().zip(mask))
                .all(|(b, (t, m))| (b ^ t) & m == 0)
        };
        let text = &data[self.prefix.len()..self.prefix.len() + text_len];
        (1..=TOKEN_TEXT_MAX).contains(&text_len)
            && !text.contains(&b'"')
            && side_matches(&data[..self.prefix.len()], &self.prefix, &self.prefix_mask)
            && side_matches(
                &data[self.prefix.len() + text_len..],
                &self.suffix,
                &self.suffix_mask,
            )
    }
}

/// The mask of one side after meeting `other`, or `None` when the two cannot share a template.
fn merged_side(bytes: &[u8], mask: &[u8], other: &[u8], skip: usize) -> Option<Vec<u8>> {
    if bytes.len() != other.len() || bytes.len() < skip {
        return None;
    }
    let values = |side: &[u8]| {
        let mut values = vec![false; skip];
        values.extend(value_positions(&side[skip..]));
        values
    };
    let (values, other_values) = (values(bytes), values(other));
    bytes
        .iter()
        .zip(other)
        .zip(mask)
        .enumerate()
        .map(|(i, ((&a, &b), &m))| {
            if a == b || m == 0 {
                Some(m)
            } else if a.is_ascii_alphanumeric()
                && b.is_ascii_alphanumeric()
                && values[i]
                && other_values[i]
            {
                Some(0)
            } else {
                None
            }
        })
        .collect()
}

/// Which bytes of a template side lie inside a JSON string value (not a key) or are digits
/// outside strings (numbers): the only bytes a merge may free. `side` starts outside a string
/// (the prefix at `data:`, the suffix past the text's closing quote).
fn value_positions(side: &[u8]) -> Vec<bool> {
    let mut values = vec![false; side.len()];
    let mut i = 0;
    while let Some(&b) = side.get(i) {
        match b {
            b'"' => {
                let start = i + 1;
                let mut end = start;
                while let Some(&c) = side.get(end) {
                    if c == b'"' {
                        break;
                    }
                    end += if c == b'\\' { 2 } else { 1 };
                }
                let end = end.min(side.len());
                let is_key = side
                    .get(end + 1..)
                    .and_then(|rest| rest.iter().find(|c| !c.is_ascii_whitespace()))
                    == Some(&b':');
                if !is_key {
                    values[start..end].fill(true);
                }
                i = end + 1;
            }
            b'0'..=b'9' => {
                values[i] = true;
                i += 1;
            }
            _ => i += 1,
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm_event(id: &str, created: u64, text: &str) -> Vec<u8> {
        format!(
            "data: {{\"id\":\"chatcmpl-{id}\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )
        .into_bytes()
    }

    #[test]
    fn learns_a_chat_token_event_and_matches_its_siblings() {
        let t = TokenTemplate::learn(&vllm_event("a1", 100, "Hi")).unwrap();
        assert!(t.prefix.ends_with(b"\"content\":\""));
        assert!(t.suffix.starts_with(b"\"},"));
        assert!(t.suffix.ends_with(b"\n\n"));
        assert!(t.matches(&vllm_event("a1", 100, " world")));
        assert!(t.matches(&vllm_event("a1", 100, "\\n")));
        // Another response's id is a different event until the merge frees it.
        assert!(!t.matches(&vllm_event("b2", 101, "Hi")));
        // A quote in the text could hide a second event: never matched.
        assert!(!t.matches(&vllm_event("a1", 100, "a\\\"b")));
        assert!(!t.matches(&vllm_event("a1", 100, "")));
        assert!(!t.matches(&vllm_event("a1", 100, &"x".repeat(TOKEN_TEXT_MAX + 1))));
    }

    #[test]
    fn merge_frees_ids_and_timestamps_only() {
        let mut t = TokenTemplate::learn(&vllm_event("a1", 100, "Hi")).unwrap();
        let other = TokenTemplate::learn(&vllm_event("b2", 101, "Hi")).unwrap();
        assert_eq!(t.merge(&other), Merge::Widened);
        assert_eq!(t.merge(&other), Merge::Same);
        assert!(t.matches(&vllm_event("c3", 109, "yo")));
        assert_eq!(t.prefix_mask.iter().filter(|&&m| m == 0).count(), 3);
        // A longer id is another shape.
        let longer = TokenTemplate::learn(&vllm_event("abc", 100, "Hi")).unwrap();
        assert_eq!(t.merge(&longer), Merge::Replaced);
        assert_eq!(t, longer);
    }

    #[test]
    fn a_structural_difference_replaces_the_template() {
        let mut t = TokenTemplate::learn(&vllm_event("a1", 100, "Hi")).unwrap();
        let event = String::from_utf8(vllm_event("a1", 100, "Hi")).unwrap();
        let other = TokenTemplate::learn(event.replace("\"m\"", "\"n\"").as_bytes()).unwrap();
        // 'm' and 'n' are letters: free. A ':' against a ',' is not.
        assert_eq!(t.merge(&other), Merge::Widened);
        let shifted = event.replace("\"logprobs\":null", "\"logprobs\":\"ab\"");
        let shifted = TokenTemplate::learn(shifted.as_bytes()).unwrap();
        assert_eq!(t.merge(&shifted), Merge::Replaced);
        assert_eq!(t, shifted);
    }

    #[test]
    fn keys_and_literals_are_never_freed() {
        let event = String::from_utf8(vllm_event("a1", 100, "Hi")).unwrap();
        let mut t = TokenTemplate::learn(event.as_bytes()).unwrap();
        // `null` against `true`: letters, but a literal, not a value string.
        let literal = event.replace("\"logprobs\":null", "\"logprobs\":true");
        let literal = TokenTemplate::learn(literal.as_bytes()).unwrap();
        assert_eq!(t.clone().merge(&literal), Merge::Replaced);
        // A key's letters.
        let key = event.replace("\"logprobs\"", "\"logprobz\"");
        let key = TokenTemplate::learn(key.as_bytes()).unwrap();
        assert_eq!(t.merge(&key), Merge::Replaced);
        assert_eq!(value_positions(b"{\"ab\":\"cd\",\"n\":12}"), {
            let mut v = vec![false; 18];
            for i in [7, 8, 15, 16] {
                v[i] = true;
            }
            v
        });
    }

    #[test]
    fn refuses_events_whose_other_fields_matter() {
        let finish = String::from_utf8(vllm_event("a1", 100, "Hi"))
            .unwrap()
            .replace("\"finish_reason\":null", "\"finish_reason\":\"stop\"");
        assert!(TokenTemplate::learn(finish.as_bytes()).is_none());
        let usage = String::from_utf8(vllm_event("a1", 100, "Hi"))
            .unwrap()
            .replace(
                "]}\n\n",
                "],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
            );
        assert!(TokenTemplate::learn(usage.as_bytes()).is_none());
        // Two texts, an empty one, an escape before the closing quote, a non-event.
        assert!(TokenTemplate::learn(b"data: {\"content\":\"a\",\"text\":\"b\"}\n\n").is_none());
        assert!(TokenTemplate::learn(&vllm_event("a1", 100, "")).is_none());
        assert!(TokenTemplate::learn(&vllm_event("a1", 100, "a\\\\")).is_none());
        assert!(TokenTemplate::learn(b"data: [DONE]\n\n").is_none());
        let long_model = String::from_utf8(vllm_event("a1", 100, "Hi"))
            .unwrap()
            .replace("\"m\"", &format!("\"{}\"", "m".repeat(TEMPLATE_SIDE_MAX)));
        assert!(TokenTemplate::learn(long_model.as_bytes()).is_none());
    }

    #[test]
    fn learns_completions_and_llama_native_events() {
        let completions = b"data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\" the\",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
        assert!(TokenTemplate::learn(completions).is_some());
        // llama.cpp's own /completion: per-token counts make each event differ: not learned.
        let native = b"data: {\"index\":0,\"content\":\" the\",\"tokens\":[],\"stop\":false,\"id_slot\":-1,\"tokens_predicted\":3,\"tokens_evaluated\":5}\n\n";
        assert!(TokenTemplate::learn(native).is_none());
    }
}
