//! HPACK's two indexing tables (RFC 7541 §2.3): the static table, and the dynamic table as far as
//! a passive observer can know it.
//!
//! An observer that attached mid-connection (or lost a header block) does not know the entries
//! the encoder inserted before. It still knows the entries inserted since: the dynamic table is a
//! FIFO indexed newest-first, so the k-th newest entry is the same on both sides for every k we
//! saw inserted, whatever the sizes of the older entries we did not see. Indexes past the known
//! entries are "unknown" while older entries may still exist there (`tail`), and an error once
//! they cannot (the table's size leaves no room for them, or a size update emptied it).

use std::collections::VecDeque;

/// RFC 7541 Appendix A; index 1 is the first element.
pub(super) const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Per-entry overhead counted in a table's size (RFC 7541 §4.1).
pub(super) const ENTRY_OVERHEAD: usize = 32;

/// One dynamic entry; `name` is `None` when it was inserted with a name taken from an entry we
/// never saw (its value is known, which header it belongs to is not).
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub name: Option<Box<[u8]>>,
    pub value: Box<[u8]>,
}

impl Entry {
    /// The entry's size as the encoder counts it; with an unknown name, a lower bound.
    fn size(&self) -> usize {
        self.name.as_ref().map_or(0, |n| n.len()) + self.value.len() + ENTRY_OVERHEAD
    }
}

/// What a dynamic index refers to.
#[derive(Debug)]
pub(super) enum Lookup<'a> {
    Entry(&'a Entry),
    /// An entry the encoder may hold that we never saw.
    Unknown,
    /// Past every entry the encoder can hold: a decoding error.
    OutOfRange,
}

#[derive(Debug)]
pub(super) struct DynamicTable {
    /// Newest first.
    entries: VecDeque<Entry>,
    /// Sum of the entries' sizes.
    size: usize,
    /// The encoder's maximum size, as its last size update (or the protocol default) set it.
    encoder_max: usize,
    /// What we keep: `encoder_max`, capped so a peer cannot make us hold more.
    cap: usize,
    /// Whether the encoder may hold entries older than ours that we never saw.
    tail: bool,
}

impl DynamicTable {
    /// A table known from its start (the connection's first header block), of the protocol's
    /// initial size.
    pub(super) fn fresh(encoder_max: usize, cap: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            encoder_max,
            cap,
            tail: false,
        }
    }

    /// A table whose past we missed: nothing known, anything possible behind.
    pub(super) fn unknown(cap: usize) -> Self {
        let mut t = Self::fresh(cap, cap);
        t.tail = true;
        t
    }

    /// Forgets what we know, after a header block we could not decode changed the table in ways
    /// we cannot replay.
    pub(super) fn desync(&mut self) {
        self.entries.clear();
        self.size = 0;
        self.tail = true;
    }

    /// Newest first, for tests.
    #[cfg(test)]
    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    pub(super) fn is_synced(&self) -> bool {
        !self.tail
    }

    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// `index` counts from 0 for the newest entry (HPACK index 62).
    pub(super) fn get(&self, index: usize) -> Lookup<'_> {
        match self.entries.get(index) {
            Some(e) => Lookup::Entry(e),
            None if self.tail => Lookup::Unknown,
            None => Lookup::OutOfRange,
        }
    }

    /// A dynamic table size update (RFC 7541 §6.3).
    pub(super) fn set_encoder_max(&mut self, max: usize) {
        self.encoder_max = max;
        if max == 0 {
            // The encoder emptied its table: from here on we know all of it.
            self.entries.clear();
            self.size = 0;
            self.tail = false;
        }
        self.evict_to(0);
    }

    pub(super) fn insert(&mut self, entry: Entry) {
        let need = entry.size();
        if need > self.encoder_max {
            // RFC 7541 §4.4: an entry larger than the table empties it and is not added.
            self.entries.clear();
            self.size = 0;
            self.tail = false;
            return;
        }
        self.evict_to(need);
        if need > self.keep_max() {
            // Held by the encoder but over our cap: we cannot keep it, so its index reads
            // unknown.
            self.entries.clear();
            self.size = 0;
            self.tail = true;
            return;
        }
        self.size += need;
        self.entries.push_front(entry);
        self.note_room();
    }

    fn keep_max(&self) -> usize {
        self.encoder_max.min(self.cap)
    }

    /// Evicts oldest entries until `room` more bytes fit.
    fn evict_to(&mut self, room: usize) {
        while self.size + room > self.keep_max() {
            // The encoder evicts oldest first, so when it evicts an entry of ours the entries
            // behind it have gone too; when only our cap evicts it, the encoder still holds it.
            let encoder_evicts = self.size + room > self.encoder_max;
            let Some(old) = self.entries.pop_back() else {
                break;
            };
            self.size = self.size.saturating_sub(old.size());
            self.tail = !encoder_evicts;
        }
        self.note_room();
    }

    /// With less room left than the smallest entry, nothing older than ours can remain.
    fn note_room(&mut self) {
        if self.encoder_max.saturating_sub(self.size) < ENTRY_OVERHEAD {
            self.tail = false;
        }
    }
}
