//! Feeds arbitrary bytes, split at arbitrary points with arbitrary capture
//! losses, to both HTTP decoders. Beyond "never panics" it checks that the
//! decoders keep their documented contracts (bounded fields, silence after
//! an error until reset), and that the token event templates the response
//! decoder learns stay within the kernel's layout and merge without panics.
//! Some syscalls are fed as the kernel's payload-free token records.
//!
//! Input layout: byte 0 picks limits and the number of control bytes; the
//! control bytes then drive the syscall sizes, losses and resets; the rest is
//! the byte stream both decoders see.
#![no_main]

use inferscope_decode::http::{
    Chunk, Limits, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent, TEMPLATE_SIDE_MAX,
    TokenTemplate,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let limits = if cfg & 1 == 0 {
        Limits::default()
    } else {
        // Small limits reach the overflow paths with small inputs.
        let small = usize::from(cfg >> 1);
        Limits {
            max_head_bytes: small * 8,
            max_body_bytes: small * 4,
            max_sse_event_bytes: small * 2,
        }
    };
    let ctrl_len = usize::from(cfg >> 2).min(rest.len());
    let (ctrl, mut stream) = rest.split_at(ctrl_len);

    let mut req = RequestDecoder::new(limits);
    let mut resp = ResponseDecoder::new(limits);
    resp.set_learn_templates(true);
    let mut template: Option<TokenTemplate> = None;
    let mut req_out = Vec::new();
    let mut resp_out = Vec::new();
    let (mut req_failed, mut resp_failed) = (false, false);
    let mut i = 0usize;
    let mut ts = 0u64;

    while !stream.is_empty() {
        // Two control bytes per syscall: size, then lost/reset flags.
        let (size_byte, flag_byte) = if ctrl.is_empty() {
            (0xff, 0)
        } else {
            let a = ctrl[i % ctrl.len()];
            let b = ctrl[(i + 1) % ctrl.len()];
            (a, b)
        };
        i += 2;
        let size = if ctrl.is_empty() {
            stream.len()
        } else {
            usize::from(size_byte) + 1
        };
        let (now, later) = stream.split_at(size.min(stream.len()));
        stream = later;
        let lost = match flag_byte >> 6 {
            3 => u64::from(flag_byte & 0x3f) + 1,
            2 if flag_byte & 1 == 1 => 1 << (flag_byte & 0x3e),
            _ => 0,
        };
        ts += 1;
        let chunk = Chunk {
            bytes: now,
            lost,
            ts_ns: ts,
        };

        req.feed(chunk, &mut req_out);
        if flag_byte & 0x3f == 0x15 {
            // The kernel summarised this write as a token event.
            resp.feed_token(ts, now.len() as u64, &mut resp_out);
        } else {
            resp.feed(chunk, &mut resp_out);
        }
        if let Some(learned) = resp.take_template() {
            for (bytes, mask) in [
                (&learned.prefix, &learned.prefix_mask),
                (&learned.suffix, &learned.suffix_mask),
            ] {
                assert!(bytes.len() <= TEMPLATE_SIDE_MAX && mask.len() == bytes.len());
            }
            match template.as_mut() {
                Some(t) => {
                    t.merge(&learned);
                    assert_eq!(t.prefix_mask.len(), t.prefix.len());
                    assert_eq!(t.suffix_mask.len(), t.suffix.len());
                }
                None => template = Some(learned),
            }
        }
        if req_failed {
            assert!(req_out.is_empty(), "request decoder spoke after an error");
        }
        if resp_failed {
            assert!(resp_out.is_empty(), "response decoder spoke after an error");
        }
        for e in req_out.drain(..) {
            match e {
                RequestEvent::Complete(s) => {
                    assert!(s.path.len() <= 256 && s.method.len() <= 256);
                    assert!(s.x_request_id.as_ref().is_none_or(|v| v.len() <= 256));
                    assert!(s.traceparent.as_ref().is_none_or(|v| v.len() <= 256));
                    assert!(s.model.as_ref().is_none_or(|v| v.len() <= 128));
                    assert!(!(s.body_truncated && s.model.is_some()));
                    if let Some(p) = &s.kv_transfer_params {
                        assert_handoff_bounded(p);
                    }
                }
                RequestEvent::Error(_) => req_failed = true,
                RequestEvent::Started { .. } => {}
            }
        }
        for e in resp_out.drain(..) {
            match e {
                ResponseEvent::Sse(s) => {
                    assert!(s.id.as_ref().is_none_or(|v| v.len() <= 128));
                    assert!(!(s.done && s.json_error));
                }
                ResponseEvent::Body(b) => {
                    assert!(b.id.as_ref().is_none_or(|v| v.len() <= 128));
                    if let Some(p) = &b.kv_transfer_params {
                        assert_handoff_bounded(p);
                    }
                }
                ResponseEvent::Error(_) => resp_failed = true,
                ResponseEvent::Head { status, .. } => assert!(!(100..200).contains(&status)),
                ResponseEvent::End { .. } => {}
            }
        }
        if flag_byte & 0x3f == 0x2a {
            req.reset();
            resp.close(ts, &mut resp_out);
            resp_out.clear();
            req_failed = false;
            resp_failed = false;
        }
    }
    resp.close(ts + 1, &mut resp_out);
});

/// A digested `kv_transfer_params`: bounded keys, entries and strings; arrays never kept.
fn assert_handoff_bounded(p: &inferscope_model::HandoffParams) {
    use inferscope_model::{HandoffValue, disagg};
    assert!(p.entries.len() <= disagg::MAX_HANDOFF_ENTRIES);
    for (k, v) in &p.entries {
        assert!(k.len() <= disagg::MAX_HANDOFF_KEY);
        if let HandoffValue::Str(s) = v {
            assert!(s.len() <= disagg::MAX_HANDOFF_STR);
        }
    }
}
