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

#[cfg(test)]
mod tests {
    use super::*;

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
