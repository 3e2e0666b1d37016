//! Protocol Buffers' wire format, read field by field without a schema: enough to take one
//! id out of the first bytes of a gRPC request message (engines name which field). The bytes
//! are untrusted and often a prefix of the message: a field cut by the end of the buffer, a
//! length past it, a varint of more than 10 bytes or a group ends the reading, never a panic.

/// One field's value as the wire gives it (groups, wire types 3 and 4, end the reading: no
/// current schema uses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireValue<'a> {
    Varint(u64),
    Fixed64(u64),
    /// Length-delimited: strings, bytes, embedded messages, packed repeated fields.
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The top-level fields of a message, in wire order; stops at the first malformed or cut
/// field.
pub struct Fields<'a> {
    rest: &'a [u8],
}

pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = (bytes.get(..n)?, bytes.get(n..)?);
    *bytes = rest;
    Some(head)
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u32, WireValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let mut rest = self.rest;
        let key = varint(&mut rest)?;
        let number = u32::try_from(key >> 3).ok().filter(|n| *n != 0)?;
        let value = match key & 7 {
            0 => WireValue::Varint(varint(&mut rest)?),
            1 => WireValue::Fixed64(u64::from_le_bytes(take(&mut rest, 8)?.try_into().ok()?)),
            2 => {
                let len = usize::try_from(varint(&mut rest)?).ok()?;
                WireValue::Bytes(take(&mut rest, len)?)
            }
            5 => WireValue::Fixed32(u32::from_le_bytes(take(&mut rest, 4)?.try_into().ok()?)),
            _ => return None,
        };
        self.rest = rest;
        Some((number, value))
    }
}

/// The first occurrence of string field `number` among the top-level fields the bytes hold
/// whole: None when absent, cut, or not UTF-8.
pub fn string_field(message: &[u8], number: u32) -> Option<&str> {
    fields(message).find_map(|(n, v)| match v {
        WireValue::Bytes(b) if n == number => std::str::from_utf8(b).ok(),
        _ => None,
    })
}

/// The bytes of the first length-delimited field `number`, and whether they are whole: an
/// embedded message whose end lies past the end of `message` (a head cut short) still yields the
/// bytes it holds, whose whole fields can be read. None when absent or malformed before it.
pub fn embedded_prefix(message: &[u8], number: u32) -> Option<(&[u8], bool)> {
    let mut read = fields(message);
    for (n, v) in read.by_ref() {
        if n == number
            && let WireValue::Bytes(b) = v
        {
            return Some((b, true));
        }
    }
    // The reading stopped at a field cut by the end of the bytes: it may be this one.
    let mut rest = read.rest;
    let key = varint(&mut rest)?;
    if key >> 3 != u64::from(number) || key & 7 != 2 {
        return None;
    }
    let len = usize::try_from(varint(&mut rest)?).ok()?;
    (len > rest.len()).then_some((rest, false))
}

/// Reads one top-level length-delimited field of a message fed in pieces of any size, holding
/// only that field's bytes: the fields before it are skipped by their lengths, however long (a
/// prompt's token ids or text ahead of the request id). Untrusted bytes: a malformed key, a
/// varint past 10 bytes, a group, or a value longer than `max` end the reading unread.
#[derive(Debug, Clone)]
pub struct FieldScanner {
    number: u32,
    max: usize,
    state: Scan,
    /// A varint being read (a key, a length, or a value skipped), and its bytes so far.
    varint: u64,
    varint_len: u32,
    value: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    Key,
    /// A varint value, skipped.
    Varint,
    /// The length of field `.0` (the wanted one or not).
    Len(bool),
    Skip(u64),
    Take(usize),
    Found,
    Failed,
}

impl FieldScanner {
    pub fn new(number: u32, max: usize) -> Self {
        Self {
            number,
            max,
            state: Scan::Key,
            varint: 0,
            varint_len: 0,
            value: Vec::new(),
        }
    }

    /// Whether the field was read whole, or the reading ended: later bytes change nothing.
    pub fn settled(&self) -> bool {
        matches!(self.state, Scan::Found | Scan::Failed)
    }

    /// Bytes of the message were lost here: unless the field was read, it is unread.
    pub fn lost(&mut self) {
        if self.state != Scan::Found {
            self.fail();
        }
    }

    /// The field's bytes, if it was read whole.
    pub fn value(&self) -> Option<&[u8]> {
        (self.state == Scan::Found).then_some(self.value.as_slice())
    }

    fn fail(&mut self) {
        self.state = Scan::Failed;
        self.value = Vec::new();
    }

    /// One byte of a varint: its value once its last byte came.
    fn varint_byte(&mut self, b: u8) -> Option<Option<u64>> {
        if self.varint_len >= 10 {
            return None;
        }
        self.varint |= u64::from(b & 0x7f) << (7 * self.varint_len);
        self.varint_len += 1;
        if b & 0x80 != 0 {
            return Some(None);
        }
        let v = self.varint;
        self.varint = 0;
        self.varint_len = 0;
        Some(Some(v))
    }

    pub fn feed(&mut self, mut bytes: &[u8]) {
        while let Some((&b, rest)) = bytes.split_first() {
            match self.state {
                Scan::Found | Scan::Failed => return,
                Scan::Skip(n) => {
                    let k = (n as usize).min(bytes.len());
                    bytes = bytes.get(k..).unwrap_or_default();
                    self.state = if n as usize == k {
                        Scan::Key
                    } else {
                        Scan::Skip(n - k as u64)
                    };
                    continue;
                }
                Scan::Take(left) => {
                    let k = left.min(bytes.len());
                    self.value
                        .extend_from_slice(bytes.get(..k).unwrap_or_default());
                    bytes = bytes.get(k..).unwrap_or_default();
                    self.state = if left == k {
                        Scan::Found
                    } else {
                        Scan::Take(left - k)
                    };
                    continue;
                }
                Scan::Key | Scan::Varint | Scan::Len(_) => {}
            }
            bytes = rest;
            let Some(done) = self.varint_byte(b) else {
                self.fail();
                return;
            };
            let Some(v) = done else { continue };
            self.state = match self.state {
                Scan::Key => {
                    let number = v >> 3;
                    if number == 0 || number > u64::from(u32::MAX) {
                        Scan::Failed
                    } else {
                        match v & 7 {
                            0 => Scan::Varint,
                            1 => Scan::Skip(8),
                            2 => Scan::Len(number == u64::from(self.number)),
                            5 => Scan::Skip(4),
                            _ => Scan::Failed,
                        }
                    }
                }
                Scan::Varint => Scan::Key,
                Scan::Len(wanted) if wanted => match usize::try_from(v) {
                    Ok(0) => Scan::Found,
                    Ok(n) if n <= self.max => {
                        self.value.reserve(n);
                        Scan::Take(n)
                    }
                    _ => Scan::Failed,
                },
                Scan::Len(_) if v == 0 => Scan::Key,
                Scan::Len(_) => Scan::Skip(v),
                other => other,
            };
            if self.state == Scan::Failed {
                self.value = Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(pieces: &[&[u8]], number: u32, max: usize) -> Option<Vec<u8>> {
        let mut s = FieldScanner::new(number, max);
        for p in pieces {
            s.feed(p);
        }
        s.value().map(<[u8]>::to_vec)
    }

    #[test]
    fn a_field_after_long_ones_is_read_from_pieces_split_anywhere() {
        // input_ids (packed, 3,000 bytes), a varint, a fixed64, then field 7 "rid-9".
        let ids = vec![0x85u8; 3000];
        let mut m = vec![0x0a, 0xb8, 0x17];
        m.extend(&ids);
        m.extend([0x18, 0x01, 0x21, 1, 2, 3, 4, 5, 6, 7, 8, 0x3a, 5]);
        m.extend(b"rid-9");
        m.extend([0x42, 2, b'x', b'y']);
        assert_eq!(scan(&[&m], 7, 256).as_deref(), Some(&b"rid-9"[..]));
        for cut in [1, 2, 3, 1000, 3003, 3005, 3014, 3015, m.len() - 3] {
            let (a, b) = m.split_at(cut);
            assert_eq!(
                scan(&[a, b], 7, 256).as_deref(),
                Some(&b"rid-9"[..]),
                "cut {cut}"
            );
        }
        let bytewise: Vec<&[u8]> = m.chunks(1).collect();
        assert_eq!(scan(&bytewise, 7, 256).as_deref(), Some(&b"rid-9"[..]));
        // Absent, too long, cut short: never a value.
        assert_eq!(scan(&[&m], 9, 256), None);
        assert_eq!(scan(&[&m], 7, 4), None);
        assert_eq!(scan(&[&m[..m.len() - 6]], 7, 256), None);
        // A group, an over-long varint, a zero or too large field number: the reading ends.
        assert_eq!(scan(&[&[0x0b, 0x3a, 1, b'a']], 7, 256), None);
        let huge = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x3a, 1, b'a'];
        assert_eq!(scan(&[&huge], 7, 256), None);
        assert_eq!(scan(&[&[0xff; 12]], 7, 256), None);
        assert_eq!(scan(&[&[0x02, 1, b'a', 0x3a, 1, b'a']], 7, 256), None);
        // A loss before the field: unread; after it: still read.
        let mut s = FieldScanner::new(7, 256);
        s.feed(&m[..3010]);
        s.lost();
        assert_eq!(s.value(), None);
        let mut s = FieldScanner::new(7, 256);
        s.feed(&m[..3021]);
        s.lost();
        assert_eq!(s.value(), Some(&b"rid-9"[..]));
    }

    #[test]
    fn an_embedded_message_cut_short_yields_its_whole_fields() {
        // field 1 "ab", then field 2 { field 3 "xyz", field 4 "0123456789" }
        let inner = [&[0x1a, 3][..], b"xyz", &[0x22, 10], b"0123456789"].concat();
        let outer = [&[0x0a, 2][..], b"ab", &[0x12, inner.len() as u8], &inner].concat();
        assert_eq!(embedded_prefix(&outer, 2), Some((&inner[..], true)));
        let cut = &outer[..outer.len() - 4];
        let (got, whole) = embedded_prefix(cut, 2).unwrap();
        assert!(!whole);
        assert_eq!(string_field(got, 3), Some("xyz"));
        assert_eq!(string_field(got, 4), None);
        assert_eq!(embedded_prefix(&outer, 5), None);
        assert_eq!(embedded_prefix(&outer[..3], 2), None);
        assert_eq!(embedded_prefix(&[], 2), None);
    }

    /// `GenerateRequest { request_id: "req-7", tokenized { input_ids: [5, 300] }, stream: true }`
    /// as protoc's encoder writes it.
    const GENERATE: &[u8] = &[
        0x0a, 5, b'r', b'e', b'q', b'-', b'7', // 1: request_id
        0x12, 5, 0x12, 3, 5, 0xac, 0x02, // 2: tokenized { 2: packed [5, 300] }
        0x28, 1, // 5: stream = true
    ];

    #[test]
    fn reads_the_fields_of_a_message() {
        let got: Vec<_> = fields(GENERATE).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (1, WireValue::Bytes(b"req-7")));
        assert_eq!(got[2], (5, WireValue::Varint(1)));
        assert_eq!(string_field(GENERATE, 1), Some("req-7"));
        assert_eq!(string_field(GENERATE, 3), None);
    }

    #[test]
    fn a_prefix_yields_the_fields_it_holds_whole() {
        for cut in 0..GENERATE.len() {
            let id = string_field(&GENERATE[..cut], 1);
            assert_eq!(id, (cut >= 7).then_some("req-7"), "cut at {cut}");
        }
    }

    #[test]
    fn fixed_width_fields_are_skipped() {
        let mut m = vec![0x09];
        m.extend_from_slice(&7u64.to_le_bytes());
        m.push(0x15);
        m.extend_from_slice(&9u32.to_le_bytes());
        m.extend_from_slice(&[0x1a, 2, b'i', b'd']);
        assert_eq!(string_field(&m, 3), Some("id"));
        let got: Vec<_> = fields(&m).map(|(n, _)| n).collect();
        assert_eq!(got, [1, 2, 3]);
    }

    #[test]
    fn malformed_input_ends_the_reading() {
        for bad in [
            &[0x0a, 0x80][..],                     // length varint cut
            &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], // length far past the end
            &[0x0b, 0x0a, 1, b'x'],                // a group start
            &[0x02, 1, b'x'],                      // field number 0
            &[
                0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
            ], // 11-byte key
        ] {
            assert_eq!(string_field(bad, 1), None, "{bad:?}");
        }
        assert_eq!(string_field(&[0x0a, 2, 0xff, 0xfe], 1), None, "not UTF-8");
    }
}
