//! HPACK (RFC 7541) header block decoding for a passive observer of one direction of an HTTP/2
//! connection: the static table, the dynamic table as far as it can be known (see [`table`]),
//! Huffman strings.
//!
//! A reference to a dynamic entry we never saw yields [`Field::Unknown`], never a guess; a block
//! that cannot be decoded leaves the table desynchronised (every dynamic reference unknown) until
//! the encoder empties its table or inserts entries we can read.

mod huffman;
mod table;
#[cfg(test)]
mod tests;

pub use huffman::HuffmanError;
use table::{DynamicTable, Entry, Lookup, STATIC};

/// The dynamic table size both sides assume until SETTINGS say otherwise (RFC 7540 §6.5.2).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// A header name or value as far as the observer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    Known(&'a [u8]),
    /// It came from a dynamic table entry inserted before we saw the connection (or in a header
    /// block we could not decode).
    Unknown,
}

/// One decoded header field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub name: Field<'a>,
    pub value: Field<'a>,
}

/// Why a header block could not be decoded (each a decoding error in RFC 7541 terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer too large")]
    IntegerOverflow,
    #[error("index 0")]
    IndexZero,
    #[error("index past the tables")]
    IndexOutOfRange,
    #[error("dynamic table size update after a header field")]
    LateSizeUpdate,
    #[error("dynamic table size update above the peer's limit")]
    SizeUpdateTooLarge,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
}

/// What one block held besides its fields.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockStats {
    /// Fields (names or values) taken from a dynamic entry we never saw.
    pub unknown_refs: u32,
    /// Whether a size update to 0 made the whole table known again.
    pub resynced: bool,
}

/// Integers past this are errors: nothing legitimate in a bounded header block comes close.
const MAX_INTEGER: usize = 1 << 28;

/// The decoding state of one direction's header blocks.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// The largest table size the peer's SETTINGS allow the encoder (`usize::MAX` when we did
    /// not see them).
    allowed_max: usize,
}

impl Decoder {
    /// A decoder for a direction seen from the connection's start; `cap` bounds the dynamic
    /// table we keep whatever the peer allows.
    pub fn fresh(cap: usize) -> Self {
        Self::with_table(
            DynamicTable::fresh(DEFAULT_TABLE_SIZE, cap),
            DEFAULT_TABLE_SIZE,
        )
    }

    /// A decoder for a direction joined mid-connection: every dynamic entry unknown at first.
    pub fn mid_connection(cap: usize) -> Self {
        Self::with_table(DynamicTable::unknown(cap), usize::MAX)
    }

    fn with_table(table: DynamicTable, allowed_max: usize) -> Self {
        Self { table, allowed_max }
    }

    /// The peer announced SETTINGS_HEADER_TABLE_SIZE. Both values stay allowed while the
    /// SETTINGS may not have been acknowledged yet, so the largest announced one is kept.
    pub fn peer_allows(&mut self, max: u32) {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if self.allowed_max == usize::MAX || max > self.allowed_max {
            self.allowed_max = max;
        }
    }

    /// A header block was lost or could not be decoded: what it inserted is unknown.
    pub fn desync(&mut self) {
        self.table.desync();
    }

    /// Whether every dynamic entry the encoder holds is known.
    pub fn is_synced(&self) -> bool {
        self.table.is_synced()
    }

    /// Decodes one complete header block, calling `on_header` for each field. On error the
    /// table is desynchronised (the fields before the error were delivered).
    pub fn decode(
        &mut self,
        block: &[u8],
        on_header: &mut dyn FnMut(Header<'_>),
    ) -> Result<BlockStats, HpackError> {
        let result = self.decode_fields(block, on_header);
        if result.is_err() {
            self.table.desync();
        }
        result
    }

    fn decode_fields(
        &mut self,
        mut block: &[u8],
        on_header: &mut dyn FnMut(Header<'_>),
    ) -> Result<BlockStats, HpackError> {
        let mut stats = BlockStats::default();
        let mut fields_seen = false;
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                let header = self.indexed(index)?;
                stats.unknown_refs += u32::from(header.name == Field::Unknown);
                on_header(header);
                fields_seen = true;
            } else if first & 0xe0 == 0x20 {
                if fields_seen {
                    return Err(HpackError::LateSizeUpdate);
                }
                let max = integer(&mut block, 5)?;
                if max > self.allowed_max {
                    return Err(HpackError::SizeUpdateTooLarge);
                }
                let was_synced = self.table.is_synced();
                self.table.set_encoder_max(max);
                stats.resynced |= !was_synced && self.table.is_synced();
            } else {
                // Literal: with incremental indexing (01), never indexed (0001), without (0000).
                let (prefix, index_it) = if first & 0xc0 == 0x40 {
                    (6, true)
                } else {
                    (4, false)
                };
                let name_index = integer(&mut block, prefix)?;
                let name = if name_index == 0 {
                    Some(string(&mut block)?)
                } else {
                    match self.indexed(name_index)?.name {
                        Field::Known(n) => Some(n.to_vec()),
                        Field::Unknown => None,
                    }
                };
                let value = string(&mut block)?;
                let name_field = name.as_deref().map_or(Field::Unknown, Field::Known);
                stats.unknown_refs += u32::from(name_field == Field::Unknown);
                on_header(Header {
                    name: name_field,
                    value: Field::Known(&value),
                });
                fields_seen = true;
                if index_it {
                    self.table.insert(Entry {
                        name: name.map(Vec::into_boxed_slice),
                        value: value.into_boxed_slice(),
                    });
                }
            }
        }
        Ok(stats)
    }

    fn indexed(&self, index: usize) -> Result<Header<'_>, HpackError> {
        if index == 0 {
            return Err(HpackError::IndexZero);
        }
        if let Some((name, value)) = STATIC.get(index - 1) {
            return Ok(Header {
                name: Field::Known(name.as_bytes()),
                value: Field::Known(value.as_bytes()),
            });
        }
        match self.table.get(index - 1 - STATIC.len()) {
            Lookup::Entry(e) => Ok(Header {
                name: e.name.as_deref().map_or(Field::Unknown, Field::Known),
                value: Field::Known(&e.value),
            }),
            Lookup::Unknown => Ok(Header {
                name: Field::Unknown,
                value: Field::Unknown,
            }),
            Lookup::OutOfRange => Err(HpackError::IndexOutOfRange),
        }
    }

    /// A decoder whose peer set the table size to `size` (RFC 7541 Appendix C.5 uses 256).
    #[cfg(test)]
    fn fresh_sized(size: usize, cap: usize) -> Self {
        Self::with_table(DynamicTable::fresh(size, cap), size)
    }

    #[cfg(test)]
    fn table(&self) -> &DynamicTable {
        &self.table
    }
}

/// An HPACK integer with an N-bit prefix (RFC 7541 §5.1), consumed from the front of `block`.
fn integer(block: &mut &[u8], prefix_bits: u8) -> Result<usize, HpackError> {
    let (&first, mut rest) = block.split_first().ok_or(HpackError::Truncated)?;
    let mask = (1u16 << prefix_bits) as u8 - 1;
    let mut value = usize::from(first & mask);
    if value == usize::from(mask) {
        let mut shift = 0u32;
        loop {
            let (&b, after) = rest.split_first().ok_or(HpackError::Truncated)?;
            rest = after;
            value += usize::from(b & 0x7f) << shift;
            if value > MAX_INTEGER {
                return Err(HpackError::IntegerOverflow);
            }
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err(HpackError::IntegerOverflow);
            }
        }
    }
    *block = rest;
    Ok(value)
}

/// A string literal (RFC 7541 §5.2), Huffman-decoded where it is coded.
fn string(block: &mut &[u8]) -> Result<Vec<u8>, HpackError> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, 7)?;
    if len > block.len() {
        return Err(HpackError::Truncated);
    }
    let (raw, rest) = block.split_at(len);
    *block = rest;
    if !huffman {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::with_capacity(len + len / 2);
    // The shortest code is 5 bits, so the output is at most 8/5 of the input.
    huffman::decode(raw, &mut out, len.saturating_mul(2))?;
    Ok(out)
}
