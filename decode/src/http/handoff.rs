//! A request's or response's `kv_transfer_params` object digested into [`HandoffParams`]:
//! scalars kept (strings bounded), arrays and nested objects reduced to a length and a digest
//! of their content, so block ids and any token ids in it are never kept.
use std::fmt;

use inferscope_model::{
    HandoffParams, HandoffValue,
    disagg::{MAX_HANDOFF_ENTRIES, MAX_HANDOFF_KEY, MAX_HANDOFF_STR, fnv1a},
};
use serde::{
    Deserialize,
    de::{Deserializer, MapAccess, SeqAccess, Visitor},
};

/// The digested object; null or any other JSON type is `None` (not a hand-off).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Handoff(pub Option<HandoffParams>);

impl<'de> Deserialize<'de> for Handoff {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Handoff;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a kv_transfer_params object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Handoff, A::Error> {
                let mut params = HandoffParams::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let value = map.next_value::<Value>()?.0;
                    if key.len() > MAX_HANDOFF_KEY || params.entries.len() >= MAX_HANDOFF_ENTRIES {
                        params.truncated = true;
                        continue;
                    }
                    params.entries.push((key.into_owned(), value));
                }
                Ok(Handoff(Some(params)))
            }
            fn visit_unit<E>(self) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Handoff, E> {
                Ok(Handoff(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Handoff, A::Error> {
                Digest::visit(seq)?;
                Ok(Handoff(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// One value of the object.
struct Value(HandoffValue);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value(HandoffValue::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
                Ok(Value(HandoffValue::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
                Ok(Value(HandoffValue::Int(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
                Ok(Value(match i64::try_from(v) {
                    Ok(i) => HandoffValue::Int(i),
                    Err(_) => digest(Digest::scalar(v.to_string().as_bytes())),
                }))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
                Ok(Value(digest(Digest::scalar(&v.to_bits().to_le_bytes()))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Value, E> {
                Ok(Value(if v.len() <= MAX_HANDOFF_STR {
                    HandoffValue::Str(v.to_owned())
                } else {
                    HandoffValue::Digest {
                        len: v.len() as u64,
                        hash: fnv1a(v.as_bytes(), 0),
                    }
                }))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
                let d = Digest::visit(seq)?;
                Ok(Value(HandoffValue::Digest {
                    len: d.len,
                    hash: d.hash,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
                let d = Digest::visit_map(map)?;
                Ok(Value(HandoffValue::Digest {
                    len: d.len,
                    hash: d.hash,
                }))
            }
        }
        d.deserialize_any(V)
    }
}

fn digest(d: Digest) -> HandoffValue {
    HandoffValue::Digest {
        len: d.len,
        hash: d.hash,
    }
}

/// Length and digest of any JSON value, folded without collecting it.
struct Digest {
    len: u64,
    hash: u64,
}

impl Digest {
    fn scalar(text: &[u8]) -> Digest {
        Digest {
            len: 1,
            hash: fnv1a(text, 0),
        }
    }

    fn visit<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Digest, A::Error> {
        let mut d = Digest {
            len: 0,
            hash: fnv1a(b"[", 0),
        };
        while let Some(e) = seq.next_element::<Digest>()? {
            d.len += 1;
            d.hash = fnv1a(&e.hash.to_le_bytes(), d.hash);
        }
        Ok(d)
    }

    fn visit_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Digest, A::Error> {
        let mut d = Digest {
            len: 0,
            hash: fnv1a(b"{", 0),
        };
        while let Some((k, v)) = map.next_entry::<Digest, Digest>()? {
            d.len += 1;
            d.hash = fnv1a(&k.hash.to_le_bytes(), d.hash);
            d.hash = fnv1a(&v.hash.to_le_bytes(), d.hash);
        }
        Ok(d)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Digest;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E>(self) -> Result<Digest, E> {
                Ok(Digest::scalar(b"null"))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Digest, E> {
                Ok(Digest::scalar(if v { b"true" } else { b"false" }))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Digest, E> {
                Ok(Digest::scalar(v.to_string().as_bytes()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Digest, E> {
                Ok(Digest::scalar(v.to_string().as_bytes()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Digest, E> {
                Ok(Digest::scalar(&v.to_bits().to_le_bytes()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Digest, E> {
                let mut d = Digest::scalar(v.as_bytes());
                d.hash = fnv1a(b"\"", d.hash);
                Ok(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Digest, A::Error> {
                Digest::visit(seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Digest, A::Error> {
                Digest::visit_map(map)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Option<HandoffParams> {
        serde_json::from_str::<Handoff>(json).unwrap().0
    }

    #[test]
    fn keeps_scalars_and_digests_arrays() {
        let p = parse(
            r#"{"do_remote_prefill":true,"remote_engine_id":"e1","remote_port":5600,
                "remote_block_ids":[1,2,3],"prompt_token_ids":[9,9],"x":null,"tp":1.5}"#,
        )
        .unwrap();
        assert_eq!(p.bool("do_remote_prefill"), Some(true));
        assert_eq!(p.str("remote_engine_id"), Some("e1"));
        assert_eq!(p.int("remote_port"), Some(5600));
        assert!(matches!(
            p.get("remote_block_ids"),
            Some(HandoffValue::Digest { len: 3, .. })
        ));
        assert!(!p.has("x"));
        // The same ids in another order are another digest; the same ids the same one.
        let q = parse(r#"{"remote_block_ids":[1,2,3]}"#).unwrap();
        let r = parse(r#"{"remote_block_ids":[3,2,1]}"#).unwrap();
        assert_eq!(p.get("remote_block_ids"), q.get("remote_block_ids"));
        assert_ne!(q.get("remote_block_ids"), r.get("remote_block_ids"));
        // Nested lists of block ids (one per KV cache group) digest too.
        let nested = parse(r#"{"remote_block_ids":[[1,2],[3]]}"#).unwrap();
        assert!(matches!(
            nested.get("remote_block_ids"),
            Some(HandoffValue::Digest { len: 2, .. })
        ));
    }

    #[test]
    fn is_bounded() {
        let long = "a".repeat(MAX_HANDOFF_STR + 1);
        let mut json = format!(r#"{{"remote_host":"{long}""#);
        for i in 0..MAX_HANDOFF_ENTRIES + 5 {
            json.push_str(&format!(r#","k{i}":{i}"#));
        }
        json.push('}');
        let p = parse(&json).unwrap();
        assert!(matches!(
            p.get("remote_host"),
            Some(HandoffValue::Digest { len, .. }) if *len == long.len() as u64
        ));
        assert_eq!(p.entries.len(), MAX_HANDOFF_ENTRIES);
        assert!(p.truncated);
    }

    #[test]
    fn anything_but_an_object_is_no_handoff() {
        for json in ["null", "1", "\"x\"", "[1,2]", "true"] {
            assert_eq!(parse(json), None, "{json}");
        }
    }
}
