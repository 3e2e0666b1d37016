//! A connection's token event template in the kernel's layout ([`StreamTemplate`]): bytes and
//! masks packed into little-endian words, as the exit program compares them.
use inferscope_common::{StreamTemplate, TEMPLATE_BYTES, TEMPLATE_WORDS};

/// One side of a template (prefix or suffix): its bytes and which of them must match.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TemplateSide<'a> {
    pub bytes: &'a [u8],
    /// 0xff: must match; 0: free.
    pub mask: &'a [u8],
}

/// The kernel's template for connection `conn_gen` (0 for a process's template, which the
/// kernel copies per connection), or `None` when a side does not fit (or its mask does not
/// cover it).
pub(crate) fn kernel_template(
    conn_gen: u64,
    prefix: TemplateSide<'_>,
    suffix: TemplateSide<'_>,
) -> Option<StreamTemplate> {
    let (prefix_words, prefix_mask) = pack(prefix)?;
    let (suffix_words, suffix_mask) = pack(suffix)?;
    Some(StreamTemplate {
        conn_gen,
        prefix_len: u16::try_from(prefix.bytes.len()).ok()?,
        suffix_len: u16::try_from(suffix.bytes.len()).ok()?,
        // The kernel arms it at the connection's next body write: a response already under
        // way has its id decoded by then.
        armed: 0,
        // Set per install by `SocketProbes::set_process_template`.
        version: 0,
        _pad: [0; 7],
        key: 0,
        prefix: prefix_words,
        prefix_mask,
        suffix: suffix_words,
        suffix_mask,
        batch: Default::default(),
    })
}

/// Bytes and mask as words; past the side's length the mask is 0 (the kernel compares the words
/// the length covers, the last one whole).
fn pack(side: TemplateSide<'_>) -> Option<([u64; TEMPLATE_WORDS], [u64; TEMPLATE_WORDS])> {
    if side.bytes.len() > TEMPLATE_BYTES || side.mask.len() != side.bytes.len() {
        return None;
    }
    let mut bytes = [0u8; TEMPLATE_BYTES];
    let mut mask = [0u8; TEMPLATE_BYTES];
    bytes[..side.bytes.len()].copy_from_slice(side.bytes);
    mask[..side.mask.len()].copy_from_slice(side.mask);
    let words = |raw: &[u8; TEMPLATE_BYTES]| {
        std::array::from_fn(|i| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&raw[i * 8..i * 8 + 8]);
            u64::from_le_bytes(word)
        })
    };
    Some((words(&bytes), words(&mask)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_little_endian_words_with_the_mask_ending_at_the_length() {
        let prefix = b"data: {\"id\":\"x\",\"content\":\"";
        let mut mask = vec![0xff; prefix.len()];
        mask[13] = 0; // the id's byte is free
        let t = kernel_template(
            7,
            TemplateSide {
                bytes: prefix,
                mask: &mask,
            },
            TemplateSide {
                bytes: b"\"}\n\n",
                mask: &[0xff; 4],
            },
        )
        .unwrap();
        assert_eq!((t.conn_gen, t.prefix_len, t.suffix_len), (7, 27, 4));
        assert_eq!(t.prefix[0].to_le_bytes(), *b"data: {\"");
        assert_eq!(t.prefix_mask[0], u64::MAX);
        assert_eq!(
            t.prefix_mask[1].to_le_bytes(),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff]
        );
        // 27 bytes: the fourth word keeps 3, the rest none.
        assert_eq!(t.prefix_mask[3], 0xff_ffff);
        assert!(t.prefix_mask[4..].iter().all(|&m| m == 0));
        assert_eq!(t.suffix_mask[0], 0xffff_ffff);
        assert_eq!(t.armed, 0);
    }

    #[test]
    fn refuses_sides_that_do_not_fit() {
        let long = vec![b'a'; TEMPLATE_BYTES + 1];
        let side = |bytes: &'static [u8], mask: &'static [u8]| TemplateSide { bytes, mask };
        let long: &'static [u8] = long.leak();
        let mask: &'static [u8] = vec![0xff; long.len()].leak();
        assert!(kernel_template(1, side(long, mask), side(b"\"}", &[0xff; 2])).is_none());
        assert!(kernel_template(1, side(b"ab", &[0xff]), side(b"\"}", &[0xff; 2])).is_none());
    }
}
