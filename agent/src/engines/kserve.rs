//! KServe's v2 inference protocol over gRPC (`inference.GRPCInferenceService`, Triton's
//! `grpc_service.proto`), as Triton serves it for every backend, TensorRT-LLM's among them:
//! `ModelInfer` is one call per stream, `ModelStreamInfer` one stream of many calls.
//!
//! Only ids and flags are read, from the heads of messages; tensors (prompts, tokens) are never
//! looked at.

use inferscope_decode::protobuf::{self, WireValue};

use super::{LastReply, StreamReply};

pub(super) const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
pub(super) const MODEL_STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// `ModelInferRequest.id` and `ModelInferResponse.id`.
pub(super) const ID_FIELD: u32 = 3;
/// `ModelInferResponse.parameters`: a map of `InferParameter`s.
const PARAMETERS_FIELD: u32 = 4;
/// `ModelStreamInferResponse.error_message` and `.infer_response`.
const ERROR_MESSAGE_FIELD: u32 = 1;
const INFER_RESPONSE_FIELD: u32 = 2;
/// The response parameter Triton sets on every streamed response, true on a call's last
/// (server `stream_infer_handler.cc`: `params["triton_final_response"].set_bool_param(is_complete)`).
const FINAL_PARAMETER: &[u8] = b"triton_final_response";

/// The id a `ModelInferRequest` head names its call with; None when empty or unread.
pub(super) fn request_id(head: &[u8]) -> Option<String> {
    protobuf::string_field(head, ID_FIELD)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// What a `ModelStreamInferResponse` head says of its call.
pub(super) fn stream_response(head: &[u8]) -> StreamReply {
    let error = has_error_message(head);
    let Some((response, whole)) = protobuf::embedded_prefix(head, INFER_RESPONSE_FIELD) else {
        // An error text too long for the head hides the rest; an error ends its call unless
        // the flag says otherwise, and here it cannot.
        return StreamReply {
            id: None,
            last: if error {
                LastReply::Yes
            } else {
                LastReply::Unread
            },
            error,
        };
    };
    let mut id = None;
    let mut last = None;
    // Fields come in number order: one past the parameters means they were all read.
    let mut parameters_read = whole;
    for (number, value) in protobuf::fields(response) {
        match (number, value) {
            (ID_FIELD, WireValue::Bytes(b)) => {
                id = std::str::from_utf8(b)
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned);
            }
            (PARAMETERS_FIELD, WireValue::Bytes(entry)) => {
                if let Some(flag) = final_flag(entry) {
                    last = Some(flag);
                }
            }
            (n, _) if n > PARAMETERS_FIELD => parameters_read = true,
            _ => {}
        }
    }
    let last = match last {
        Some(true) => LastReply::Yes,
        Some(false) => LastReply::No,
        // A server that never sets the flag answers each call once.
        None if parameters_read || error => LastReply::Yes,
        None => LastReply::Unread,
    };
    StreamReply { id, last, error }
}

/// Whether the response opens with a non-empty `error_message`, whole or cut.
fn has_error_message(head: &[u8]) -> bool {
    match protobuf::embedded_prefix(head, ERROR_MESSAGE_FIELD) {
        Some((text, whole)) => !text.is_empty() || !whole,
        None => false,
    }
}

/// The value of a `map<string, InferParameter>` entry if its key is the final flag: the entry is
/// `{ key = 1; value = 2 }`, the value `{ oneof { bool_param = 1; ... } }`.
fn final_flag(entry: &[u8]) -> Option<bool> {
    let mut key = None;
    let mut value: &[u8] = &[];
    for (number, v) in protobuf::fields(entry) {
        match (number, v) {
            (1, WireValue::Bytes(k)) => key = Some(k),
            (2, WireValue::Bytes(v)) => value = v,
            _ => {}
        }
    }
    if key? != FINAL_PARAMETER {
        return None;
    }
    // An empty value (no member of the oneof set) reads as false, as protobuf's default.
    Some(protobuf::fields(value).any(|(n, v)| n == 1 && v == WireValue::Varint(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u32, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![(number << 3 | 2) as u8];
        let mut len = bytes.len();
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                v.push(b);
                break;
            }
            v.push(b | 0x80);
        }
        v.extend_from_slice(bytes);
        v
    }

    fn parameter(key: &str, value: &[u8]) -> Vec<u8> {
        field(
            PARAMETERS_FIELD,
            &[field(1, key.as_bytes()), field(2, value)].concat(),
        )
    }

    fn response(id: &str, last: Option<bool>, outputs: usize) -> Vec<u8> {
        let mut inner = [
            field(1, b"tensorrt_llm_bls"),
            field(ID_FIELD, id.as_bytes()),
        ]
        .concat();
        inner.extend(parameter("other", &[0x18, 1]));
        if let Some(last) = last {
            inner.extend(parameter("triton_final_response", &[0x08, u8::from(last)]));
        }
        inner.extend(field(5, &vec![b'x'; outputs]));
        field(INFER_RESPONSE_FIELD, &inner)
    }

    #[test]
    fn a_request_names_its_call_by_its_id() {
        let head = [
            field(1, b"ensemble"),
            field(2, b""),
            field(ID_FIELD, b"req-7"),
        ]
        .concat();
        assert_eq!(request_id(&head).as_deref(), Some("req-7"));
        assert_eq!(request_id(&field(1, b"ensemble")), None);
        assert_eq!(
            request_id(&[field(1, b"m"), field(ID_FIELD, b"")].concat()),
            None
        );
    }

    #[test]
    fn the_final_flag_ends_a_call_and_its_absence_in_a_whole_response_does_too() {
        let r = stream_response(&response("a", Some(false), 40));
        assert_eq!(
            (r.id.as_deref(), r.last, r.error),
            (Some("a"), LastReply::No, false)
        );
        assert_eq!(
            stream_response(&response("a", Some(true), 40)).last,
            LastReply::Yes
        );
        assert_eq!(
            stream_response(&response("b", None, 40)).last,
            LastReply::Yes
        );
        // Cut inside the outputs: the parameters were read whole.
        let whole = response("c", Some(false), 4000);
        assert_eq!(stream_response(&whole[..300]).last, LastReply::No);
        // Cut before the flag: unknown, never guessed.
        let flagged = response("d", Some(true), 10);
        let cut = flagged.windows(5).position(|w| w == b"trito").unwrap();
        let r = stream_response(&flagged[..cut]);
        assert_eq!((r.id.as_deref(), r.last), (Some("d"), LastReply::Unread));
    }

    #[test]
    fn an_error_response_ends_its_call() {
        let mut head = field(ERROR_MESSAGE_FIELD, b"in ensemble 'x': model failed");
        head.extend(response("e", Some(true), 0));
        let r = stream_response(&head);
        assert_eq!(
            (r.id.as_deref(), r.last, r.error),
            (Some("e"), LastReply::Yes, true)
        );
        // An error text longer than the head: the call it ends is unknown.
        let long = field(ERROR_MESSAGE_FIELD, &[b'e'; 3000]);
        let r = stream_response(&long[..1024]);
        assert_eq!((r.id, r.last, r.error), (None, LastReply::Yes, true));
    }

    #[test]
    fn hostile_heads_never_panic() {
        for head in [
            &[][..],
            &[0xff; 40],
            &[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f],
            &[0x12, 2, 0x22, 9],
        ] {
            let _ = stream_response(head);
            let _ = request_id(head);
        }
    }
}
