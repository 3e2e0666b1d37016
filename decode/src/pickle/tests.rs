use super::*;

const REQUEST: &[u8] = include_bytes!("../../../tests/fixtures/sglang/0.5.23/request.pickle");
const OUTPUT: &[u8] = include_bytes!("../../../tests/fixtures/sglang/0.5.23/output.pickle");

fn limits() -> PickleLimits {
    PickleLimits::default()
}

#[test]
fn reads_a_real_sglang_request_as_an_inert_tree() {
    let v = read(REQUEST, &limits()).unwrap();
    // msgspec structs pickle as msgspec._utils.rebuild(cls, {field: value}).
    let Value::Reduce(callable, args, _) = &v else {
        panic!("not a REDUCE: {v:?}")
    };
    assert!(callable.is_global("msgspec._utils", "rebuild"));
    let args = args.items().unwrap();
    assert!(args[0].is_global("sglang.srt.managers.io_struct", "TokenizedGenerateReqInput"));
    let fields = &args[1];
    assert_eq!(
        fields.get("rid").and_then(Value::as_str),
        Some("6f1c0e5a9b7d4c2e8a1b3c5d7e9f0a12")
    );
    // input_ids: array._array_reconstructor(array.array, 'l', 12, <37 * 8 bytes>).
    let Some(Value::Reduce(f, a, _)) = fields.get("input_ids") else {
        panic!("input_ids")
    };
    assert!(f.is_global("array", "_array_reconstructor"));
    assert_eq!(a.items().unwrap()[3], Value::Bytes(37 * 8));
    assert_eq!(fields.get("stream"), Some(&Value::Bool(true)));
}

#[test]
fn memoized_strings_are_reused_by_get() {
    let v = read(OUTPUT, &limits()).unwrap();
    let Value::Reduce(_, args, _) = &v else {
        panic!()
    };
    let fields = &args.items().unwrap()[1];
    let stats = fields.get("time_stats").and_then(Value::items).unwrap();
    assert_eq!(stats.len(), 2);
    // The second stats object's keys come from the memo (BINGET).
    for (s, want) in stats.iter().zip([100.375, 100.625]) {
        let Value::Build(obj, state, _) = s else {
            panic!("{s:?}")
        };
        assert!(matches!(&**obj, Value::NewObj(cls, _, _)
            if cls.is_global("sglang.srt.observability.req_time_stats", "SchedulerReqTimeStats")));
        assert_eq!(
            state.get("forward_entry_time").and_then(Value::as_float),
            Some(want)
        );
    }
}

#[test]
fn every_prefix_of_a_real_pickle_is_truncated_never_a_panic() {
    for n in 0..OUTPUT.len() {
        assert_eq!(
            read(&OUTPUT[..n], &limits()),
            Err(PickleError::Truncated),
            "prefix {n}"
        );
    }
}

#[test]
fn long_strings_keep_only_their_length() {
    let mut p = vec![0x80, 4, b'X'];
    p.extend_from_slice(&1000u32.to_le_bytes());
    p.extend(std::iter::repeat_n(b'a', 1000));
    p.push(b'.');
    assert_eq!(read(&p, &limits()), Ok(Value::LongStr(1000)));
}

#[test]
fn hostile_pickles_are_refused() {
    let l = limits();
    // Unknown opcode.
    assert_eq!(read(&[0x80, 4, 0xff], &l), Err(PickleError::UnknownOpcode));
    // Protocol 0 text and persistent ids.
    assert_eq!(read(b"I1\n.", &l), Err(PickleError::Unsupported));
    assert_eq!(
        read(&[0x80, 4, b'N', b'Q'], &l),
        Err(PickleError::Unsupported)
    );
    assert_eq!(read(&[0x80, 1], &l), Err(PickleError::Unsupported));
    // A huge length: refused without allocating it.
    let mut huge = vec![0x80, 4, 0x8e];
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(read(&huge, &l), Err(PickleError::TooLong));
    let mut big = vec![0x80, 4, 0x8d];
    big.extend_from_slice(&(1u64 << 40).to_le_bytes());
    assert_eq!(read(&big, &l), Err(PickleError::TooLong));
    // Deep nesting: ] ] ] ... with APPEND.
    let mut deep = vec![0x80, 4];
    deep.extend(std::iter::repeat_n(b']', 200));
    deep.extend(std::iter::repeat_n(b'a', 199));
    deep.push(b'.');
    assert_eq!(read(&deep, &l), Err(PickleError::TooDeep));
    // Deep tuples through TUPLE1.
    let mut tuples = vec![0x80, 4, b'N'];
    tuples.extend(std::iter::repeat_n(0x85, 200));
    assert_eq!(read(&tuples, &l), Err(PickleError::TooDeep));
    // Billion laughs: each round memoizes the newest list and builds a list of two copies of
    // it, doubling the size.
    let mut laughs = vec![0x80, 4, b']'];
    for i in 0..64u8 {
        laughs.extend_from_slice(&[0x94, b'(', b'h', i, b'h', i, b'l']);
    }
    laughs.push(b'.');
    let r = read(&laughs, &l);
    assert!(matches!(r, Err(PickleError::OverBudget)), "{r:?}");
    // Stack underflow and a misplaced mark.
    assert_eq!(read(&[0x80, 4, b'R'], &l), Err(PickleError::Stack));
    assert_eq!(read(&[0x80, 4, b'(', b'.'], &l), Err(PickleError::Stack));
    // A memo index nothing was put at.
    assert_eq!(read(&[0x80, 4, b'h', 9], &l), Err(PickleError::Memo));
    // APPEND onto a non-list.
    assert_eq!(
        read(&[0x80, 4, b'N', b'N', b'a'], &l),
        Err(PickleError::Type)
    );
    // GLOBAL and REDUCE of anything are kept as names, never resolved.
    let os = b"\x80\x04cos\nsystem\nX\x02\x00\x00\x00lsR.";
    let v = read(os, &l).unwrap();
    assert!(matches!(&v, Value::Reduce(f, _, _) if f.is_global("os", "system")));
}

#[test]
fn integers_of_every_width() {
    let l = limits();
    assert_eq!(read(&[0x80, 4, b'K', 200, b'.'], &l), Ok(Value::Int(200)));
    assert_eq!(read(&[0x80, 4, b'M', 1, 1, b'.'], &l), Ok(Value::Int(257)));
    assert_eq!(
        read(&[0x80, 4, b'J', 0xff, 0xff, 0xff, 0xff, b'.'], &l),
        Ok(Value::Int(-1))
    );
    assert_eq!(
        read(&[0x80, 4, 0x8a, 1, 0xfe, b'.'], &l),
        Ok(Value::Int(-2))
    );
    let mut wide = vec![0x80, 4, 0x8a, 9];
    wide.extend([1u8; 9]);
    wide.push(b'.');
    assert_eq!(read(&wide, &l), Ok(Value::BigInt(9)));
}
