//! RFC 7541 Appendix C, and what a passive observer adds: unknown entries after a mid-connection
//! attach, resynchronisation, hostile integers and sizes.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

type Owned = (Option<String>, Option<String>);

fn field(f: Field<'_>) -> Option<String> {
    match f {
        Field::Known(b) => Some(String::from_utf8(b.to_vec()).unwrap()),
        Field::Unknown => None,
    }
}

fn decode(d: &mut Decoder, block: &[u8]) -> Result<(Vec<Owned>, BlockStats), HpackError> {
    let mut out = Vec::new();
    let stats = d.decode(block, &mut |h| out.push((field(h.name), field(h.value))))?;
    Ok((out, stats))
}

fn known(pairs: &[(&str, &str)]) -> Vec<Owned> {
    pairs
        .iter()
        .map(|(n, v)| (Some(n.to_string()), Some(v.to_string())))
        .collect()
}

fn table_of(d: &Decoder) -> (Vec<(String, String)>, usize) {
    let entries = d
        .table()
        .entries()
        .map(|e| {
            (
                String::from_utf8(e.name.as_deref().unwrap().to_vec()).unwrap(),
                String::from_utf8(e.value.to_vec()).unwrap(),
            )
        })
        .collect();
    (entries, d.table().size())
}

struct Example {
    block: &'static str,
    fields: &'static [(&'static str, &'static str)],
    table: &'static [(&'static str, &'static str)],
    size: usize,
}

fn run(d: &mut Decoder, examples: &[Example]) {
    for (i, ex) in examples.iter().enumerate() {
        let (fields, stats) = decode(d, &hex(ex.block)).unwrap();
        assert_eq!(fields, known(ex.fields), "example {i}");
        assert_eq!(stats.unknown_refs, 0);
        let want: Vec<_> = ex
            .table
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(table_of(d), (want, ex.size), "example {i}");
        assert!(d.is_synced());
    }
}

#[test]
fn c2_literal_representations() {
    let mut d = Decoder::fresh(64 * 1024);
    run(
        &mut d,
        &[Example {
            block: "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            fields: &[("custom-key", "custom-header")],
            table: &[("custom-key", "custom-header")],
            size: 55,
        }],
    );
    let mut d = Decoder::fresh(64 * 1024);
    run(
        &mut d,
        &[
            Example {
                block: "040c 2f73 616d 706c 652f 7061 7468",
                fields: &[(":path", "/sample/path")],
                table: &[],
                size: 0,
            },
            Example {
                block: "1008 7061 7373 776f 7264 0673 6563 7265 74",
                fields: &[("password", "secret")],
                table: &[],
                size: 0,
            },
            Example {
                block: "82",
                fields: &[(":method", "GET")],
                table: &[],
                size: 0,
            },
        ],
    );
}

const REQ1: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
];
const REQ2: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
    ("cache-control", "no-cache"),
];
const REQ3: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html"),
    (":authority", "www.example.com"),
    ("custom-key", "custom-value"),
];
const REQ_T1: &[(&str, &str)] = &[(":authority", "www.example.com")];
const REQ_T2: &[(&str, &str)] = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const REQ_T3: &[(&str, &str)] = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];

#[test]
fn c3_requests_without_huffman() {
    let mut d = Decoder::fresh(64 * 1024);
    run(
        &mut d,
        &[
            Example {
                block: "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                fields: REQ1,
                table: REQ_T1,
                size: 57,
            },
            Example {
                block: "8286 84be 5808 6e6f 2d63 6163 6865",
                fields: REQ2,
                table: REQ_T2,
                size: 110,
            },
            Example {
                block: "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
                fields: REQ3,
                table: REQ_T3,
                size: 164,
            },
        ],
    );
}

#[test]
fn c4_requests_with_huffman() {
    let mut d = Decoder::fresh(64 * 1024);
    run(
        &mut d,
        &[
            Example {
                block: "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                fields: REQ1,
                table: REQ_T1,
                size: 57,
            },
            Example {
                block: "8286 84be 5886 a8eb 1064 9cbf",
                fields: REQ2,
                table: REQ_T2,
                size: 110,
            },
            Example {
                block: "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
                fields: REQ3,
                table: REQ_T3,
                size: 164,
            },
        ],
    );
}

const DATE1: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
const DATE2: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
const LOC: &str = "https://www.example.com";
const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
const RESP1: &[(&str, &str)] = &[
    (":status", "302"),
    ("cache-control", "private"),
    ("date", DATE1),
    ("location", LOC),
];
const RESP2: &[(&str, &str)] = &[
    (":status", "307"),
    ("cache-control", "private"),
    ("date", DATE1),
    ("location", LOC),
];
const RESP3: &[(&str, &str)] = &[
    (":status", "200"),
    ("cache-control", "private"),
    ("date", DATE2),
    ("location", LOC),
    ("content-encoding", "gzip"),
    ("set-cookie", COOKIE),
];
const RESP_T1: &[(&str, &str)] = &[
    ("location", LOC),
    ("date", DATE1),
    ("cache-control", "private"),
    (":status", "302"),
];
const RESP_T2: &[(&str, &str)] = &[
    (":status", "307"),
    ("location", LOC),
    ("date", DATE1),
    ("cache-control", "private"),
];
const RESP_T3: &[(&str, &str)] = &[
    ("set-cookie", COOKIE),
    ("content-encoding", "gzip"),
    ("date", DATE2),
];

#[test]
fn c5_responses_without_huffman_evicting() {
    let mut d = Decoder::fresh_sized(256, 64 * 1024);
    run(
        &mut d,
        &[
            Example {
                block: "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 \
                        3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 \
                        7777 2e65 7861 6d70 6c65 2e63 6f6d",
                fields: RESP1,
                table: RESP_T1,
                size: 222,
            },
            Example {
                block: "4803 3330 37c1 c0bf",
                fields: RESP2,
                table: RESP_T2,
                size: 222,
            },
            Example {
                block: "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 \
                        3220 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a \
                        584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 \
                        3630 303b 2076 6572 7369 6f6e 3d31",
                fields: RESP3,
                table: RESP_T3,
                size: 215,
            },
        ],
    );
}

#[test]
fn c6_responses_with_huffman_evicting() {
    let mut d = Decoder::fresh_sized(256, 64 * 1024);
    run(
        &mut d,
        &[
            Example {
                block: "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 \
                        66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                fields: RESP1,
                table: RESP_T1,
                size: 222,
            },
            Example {
                block: "4883 640e ffc1 c0bf",
                fields: RESP2,
                table: RESP_T2,
                size: 222,
            },
            Example {
                block: "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a \
                        839b d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 \
                        72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                fields: RESP3,
                table: RESP_T3,
                size: 215,
            },
        ],
    );
}

/// Joining after C.3.1: the reference to its `:authority` entry (index 62) reads unknown, the
/// literal inserted in C.3.2 is known from then on, and index 63 (C.3.1's entry again) stays
/// unknown: never a guess.
#[test]
fn mid_connection_unknown_entries_are_unknown_never_guessed() {
    let mut d = Decoder::mid_connection(64 * 1024);
    let (fields, stats) = decode(&mut d, &hex("8286 84be 5808 6e6f 2d63 6163 6865")).unwrap();
    assert_eq!(stats.unknown_refs, 1);
    assert_eq!(fields[3], (None, None));
    assert_eq!(
        fields[4],
        (Some("cache-control".into()), Some("no-cache".into()))
    );
    let (fields, stats) = decode(
        &mut d,
        &hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65"),
    )
    .unwrap();
    assert_eq!(stats.unknown_refs, 1);
    assert_eq!(
        fields[3],
        (None, None),
        "index 63 is C.3.1's entry, never seen"
    );
    assert!(!d.is_synced());
    // The two entries we saw are known at 62 and 63 now; 64 is still unknown.
    let (fields, _) = decode(&mut d, &hex("bebf c0")).unwrap();
    assert_eq!(
        fields,
        vec![
            (Some("custom-key".into()), Some("custom-value".into())),
            (Some("cache-control".into()), Some("no-cache".into())),
            (None, None),
        ]
    );
}

#[test]
fn a_literal_named_by_an_unknown_entry_keeps_its_name_unknown() {
    let mut d = Decoder::mid_connection(64 * 1024);
    // Literal with incremental indexing, name index 62 (unknown), value "x".
    let (fields, stats) = decode(&mut d, &hex("7e 0178")).unwrap();
    assert_eq!(fields, vec![(None, Some("x".into()))]);
    assert_eq!(stats.unknown_refs, 1);
    let (fields, _) = decode(&mut d, &hex("be")).unwrap();
    assert_eq!(fields, vec![(None, Some("x".into()))]);
}

/// A size update to 0 empties the encoder's table: everything is known from there, and an index
/// past the known entries is an error, not "unknown".
#[test]
fn size_update_to_zero_resynchronises() {
    let mut d = Decoder::mid_connection(64 * 1024);
    let (_, stats) = decode(&mut d, &hex("20 3f e1 1f 82")).unwrap();
    assert!(stats.resynced);
    assert!(d.is_synced());
    assert_eq!(decode(&mut d, &hex("be")), Err(HpackError::IndexOutOfRange));
    // The error desynchronised the table again: nothing it inserted can be trusted.
    assert!(!d.is_synced());
}

#[test]
fn size_updates_evict_and_follow_the_rules() {
    let mut d = Decoder::fresh(64 * 1024);
    decode(
        &mut d,
        &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"),
    )
    .unwrap();
    assert_eq!(table_of(&d).1, 57);
    // Shrinking below the entry evicts it.
    decode(&mut d, &hex("3f19")).unwrap(); // 31 + 25 = 56
    assert_eq!(table_of(&d), (vec![], 0));
    // An update after a field is an error.
    assert_eq!(
        decode(&mut d, &hex("82 20")),
        Err(HpackError::LateSizeUpdate)
    );
    // Above what the peer allows (4096 by default) is an error.
    let mut d = Decoder::fresh(64 * 1024);
    assert_eq!(
        decode(&mut d, &hex("3fe2 1f")), // 4097
        Err(HpackError::SizeUpdateTooLarge)
    );
    let mut d = Decoder::fresh(64 * 1024);
    d.peer_allows(8192);
    decode(&mut d, &hex("3fe2 1f")).unwrap();
}

/// The table we keep is capped whatever the peer allows; an entry over the cap reads unknown
/// afterwards, since the encoder still holds it.
#[test]
fn the_kept_table_is_capped() {
    let mut d = Decoder::fresh(100);
    d.peer_allows(1 << 20);
    // Size update to 65536: 0x3f, then 65536 - 31 = 65505 -> e1 ff 03.
    let mut block = hex("3f e1ff03");
    // Literal with indexing, name ":path" (index 4), value of 200 bytes.
    block.extend(hex("44 7f49"));
    block.extend(std::iter::repeat_n(b'a', 200));
    let (fields, _) = decode(&mut d, &block).unwrap();
    assert_eq!(fields[0].1.as_ref().unwrap().len(), 200);
    assert_eq!(table_of(&d).1, 0);
    let (fields, stats) = decode(&mut d, &hex("be")).unwrap();
    assert_eq!(fields, vec![(None, None)]);
    assert_eq!(stats.unknown_refs, 1);
}

#[test]
fn malformed_blocks_are_errors_not_panics() {
    let cases: &[(&str, HpackError)] = &[
        ("80", HpackError::IndexZero),
        ("ff", HpackError::Truncated),
        ("ffff ffff ffff ff", HpackError::IntegerOverflow),
        ("ff80 8080 8080 8001", HpackError::IntegerOverflow),
        ("40", HpackError::Truncated),
        ("4005 6162", HpackError::Truncated),
        ("400a", HpackError::Truncated),
        ("be", HpackError::IndexOutOfRange),
        ("4081 00 00", HpackError::Huffman(HuffmanError::BadPadding)),
        ("4084 ffff ffff 00", HpackError::Huffman(HuffmanError::Eos)),
    ];
    for (block, want) in cases {
        let mut d = Decoder::fresh(4096);
        assert_eq!(
            decode(&mut d, &hex(block)).map(|_| ()),
            Err(*want),
            "{block}"
        );
    }
}

/// Pseudo-random blocks never panic, and a decoder stays usable after each error.
#[test]
fn random_blocks_never_panic() {
    let mut rng = crate::http::testutil::XorShift(0x5eed);
    let mut d = Decoder::mid_connection(4096);
    for _ in 0..20_000 {
        let len = (rng.next_u64() % 40) as usize;
        let block: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let _ = d.decode(&block, &mut |_| {});
        assert!(d.table().size() <= 4096);
    }
}
