//! HPACK's static Huffman code (RFC 7541 Appendix B), decoding only.
//!
//! The code is canonical (codes of one length are consecutive, in symbol order, and shorter
//! codes sort before longer ones), so the RFC's table is fully described by each symbol's code
//! length: decoding walks the input bit by bit, comparing the code read so far against the first
//! code of its length. That is slower than the usual 4- or 8-bit state tables, but header blocks
//! are small and bounded, and a table of 257 lengths is easy to check against the RFC.

/// Code length in bits of each symbol 0..=255, then EOS (256), from RFC 7541 Appendix B.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0x00
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 0x10
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // ' ' .. '/'
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // '0' .. '?'
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // '@' .. 'O'
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 'P' .. '_'
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // '`' .. 'o'
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 'p' .. 0x7f
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 0x80
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 0x90
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 0xa0
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 0xb0
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 0xc0
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 0xd0
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 0xe0
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 0xf0
    30, // EOS
];

const MAX_LEN: usize = 30;
const EOS: u16 = 256;

/// The canonical code in a form a bit-at-a-time decoder can use.
struct Canonical {
    /// Number of codes of each length.
    count: [u16; MAX_LEN + 1],
    /// First code of each length.
    first: [u32; MAX_LEN + 1],
    /// Index into `symbols` of the first symbol of each length.
    offset: [u16; MAX_LEN + 1],
    /// Symbols ordered by (code length, symbol).
    symbols: [u16; 257],
}

const fn canonical() -> Canonical {
    let mut count = [0u16; MAX_LEN + 1];
    let mut i = 0;
    while i < 257 {
        count[CODE_LENGTHS[i] as usize] += 1;
        i += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut offset = [0u16; MAX_LEN + 1];
    let mut code = 0u32;
    let mut placed = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        first[len] = code;
        offset[len] = placed;
        code = (code + count[len] as u32) << 1;
        placed += count[len];
        len += 1;
    }
    let mut symbols = [0u16; 257];
    let mut next = offset;
    let mut s = 0;
    while s < 257 {
        let l = CODE_LENGTHS[s] as usize;
        symbols[next[l] as usize] = s as u16;
        next[l] += 1;
        s += 1;
    }
    Canonical {
        count,
        first,
        offset,
        symbols,
    }
}

static CODE: Canonical = canonical();

/// Why a Huffman string could not be decoded (RFC 7541 §5.2: all are decoding errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("huffman string holds the EOS symbol")]
    Eos,
    #[error("huffman padding longer than 7 bits or not all ones")]
    BadPadding,
    #[error("huffman string longer than the limit")]
    TooLong,
}

/// Decodes `input` appending to `out`, which may grow by at most `max_out` bytes.
pub(super) fn decode(input: &[u8], out: &mut Vec<u8>, max_out: usize) -> Result<(), HuffmanError> {
    let start = out.len();
    let mut code = 0u32;
    let mut len = 0usize;
    // Whether every bit of the code read so far is 1: padding must be a prefix of EOS.
    let mut all_ones = true;
    for &byte in input {
        for shift in (0..8).rev() {
            let bit = u32::from((byte >> shift) & 1);
            code = (code << 1) | bit;
            all_ones &= bit == 1;
            len += 1;
            let (Some(&count), Some(&first), Some(&offset)) = (
                CODE.count.get(len),
                CODE.first.get(len),
                CODE.offset.get(len),
            ) else {
                // Longer than any code: only reachable through 30 ones, which is EOS's code and
                // was matched at length 30.
                return Err(HuffmanError::Eos);
            };
            let delta = code.wrapping_sub(first);
            if delta < u32::from(count) {
                let symbol = CODE
                    .symbols
                    .get(usize::from(offset) + delta as usize)
                    .copied()
                    .unwrap_or(EOS);
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                if out.len() - start >= max_out {
                    return Err(HuffmanError::TooLong);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
                all_ones = true;
            }
        }
    }
    if len > 7 || !all_ones {
        return Err(HuffmanError::BadPadding);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(symbol: usize) -> (u32, u8) {
        let len = CODE_LENGTHS[symbol];
        let rank = CODE.symbols[usize::from(CODE.offset[usize::from(len)])..]
            .iter()
            .position(|&s| usize::from(s) == symbol)
            .unwrap();
        (CODE.first[usize::from(len)] + rank as u32, len)
    }

    /// The table is a complete prefix code (Kraft sum exactly 1), and the canonical codes it
    /// implies are the RFC's for a sample of symbols of every length class.
    #[test]
    fn lengths_give_the_rfc_codes() {
        let kraft: u64 = CODE_LENGTHS.iter().map(|&l| 1u64 << (30 - l)).sum();
        assert_eq!(kraft, 1 << 30);
        for (symbol, code, len) in [
            (b'0' as usize, 0x0, 5),
            (b'a' as usize, 0x3, 5),
            (b' ' as usize, 0x14, 6),
            (b'A' as usize, 0x21, 6),
            (b'B' as usize, 0x5d, 7),
            (b'X' as usize, 0xfc, 8),
            (b'!' as usize, 0x3f8, 10),
            (b'|' as usize, 0x7fc, 11),
            (b'#' as usize, 0xffa, 12),
            (0, 0x1ff8, 13),
            (b'^' as usize, 0x3ffc, 14),
            (b'<' as usize, 0x7ffc, 15),
            (b'\\' as usize, 0x7fff0, 19),
            (128, 0xfffe6, 20),
            (153, 0x1fffdc, 21),
            (1, 0x7fffd8, 23),
            (9, 0xffffea, 24),
            (199, 0x1ffffec, 25),
            (192, 0x3ffffe0, 26),
            (203, 0x7ffffde, 27),
            (2, 0xfffffe2, 28),
            (10, 0x3ffffffc, 30),
            (256, 0x3fffffff, 30),
        ] {
            assert_eq!(code_of(symbol), (code, len), "symbol {symbol}");
        }
    }

    fn encode(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u64, 0u32);
        for &b in s {
            let (code, len) = code_of(usize::from(b));
            acc = (acc << len) | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
        }
        out
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        decode(&encode(&all), &mut out, 1024).unwrap();
        assert_eq!(out, all);
    }

    #[test]
    fn rfc_examples() {
        let mut out = Vec::new();
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        decode(&www, &mut out, 64).unwrap();
        assert_eq!(out, b"www.example.com");
    }

    #[test]
    fn bad_padding_and_eos_are_errors() {
        let mut out = Vec::new();
        // 'a' (00011) then three zero bits: padding must be ones.
        assert_eq!(
            decode(&[0b0001_1000], &mut out, 8),
            Err(HuffmanError::BadPadding)
        );
        // A full byte of ones after a symbol: padding of 8 bits.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut out, 8),
            Err(HuffmanError::BadPadding)
        );
        // EOS itself.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out, 8),
            Err(HuffmanError::Eos)
        );
        assert_eq!(
            decode(&encode(b"abc"), &mut out, 2),
            Err(HuffmanError::TooLong)
        );
    }
}
