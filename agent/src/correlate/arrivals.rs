//! When did a request's bytes reach the server? TCP segment arrivals (tcp:tcp_probe) per peer,
//! looked up when the server reads the request. The lookup window starts after the previous
//! response on the connection ended, because an HTTP/1.1 client sends its next request only
//! after it has the previous response.
use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
};

use crate::capture::Segment;

/// Segments remembered per connection; older ones are dropped (counted).
const MAX_PER_PEER: usize = 64;
/// Connections tracked at once.
const MAX_PEERS: usize = 65536;
/// Segments older than this are swept: their reader never came.
const MAX_AGE_NS: u64 = 60_000_000_000;

type PeerKey = (u16, IpAddr, u16);

#[derive(Default)]
pub struct ArrivalIndex {
    by_peer: HashMap<PeerKey, VecDeque<u64>>,
    pub dropped: u64,
}

impl ArrivalIndex {
    pub fn on_segment(&mut self, segment: &Segment) {
        let key = (segment.local_port, segment.remote, segment.remote_port);
        if !self.by_peer.contains_key(&key) && self.by_peer.len() >= MAX_PEERS {
            self.dropped += 1;
            return;
        }
        let times = self.by_peer.entry(key).or_default();
        if times.len() >= MAX_PER_PEER {
            times.pop_front();
            self.dropped += 1;
        }
        times.push_back(segment.ts_ns);
    }

    /// The first segment from `remote` to `local_port` that arrived in `(after_ns, upto_ns]`;
    /// segments up to `upto_ns` are consumed.
    pub fn first_arrival(
        &mut self,
        local_port: u16,
        remote: SocketAddr,
        after_ns: u64,
        upto_ns: u64,
    ) -> Option<u64> {
        let key = (local_port, remote.ip(), remote.port());
        let times = self.by_peer.get_mut(&key)?;
        let found = times
            .iter()
            .copied()
            .find(|&t| t > after_ns && t <= upto_ns);
        while times.front().is_some_and(|&t| t <= upto_ns) {
            times.pop_front();
        }
        if times.is_empty() {
            self.by_peer.remove(&key);
        }
        found
    }

    pub fn forget_peer(&mut self, local_port: u16, remote: SocketAddr) {
        self.by_peer
            .remove(&(local_port, remote.ip(), remote.port()));
    }

    pub fn sweep(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(MAX_AGE_NS);
        self.by_peer.retain(|_, times| {
            while times.front().is_some_and(|&t| t < cutoff) {
                times.pop_front();
            }
            !times.is_empty()
        });
    }

    pub fn len(&self) -> usize {
        self.by_peer.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_peer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(port: u16, ts: u64) -> Segment {
        Segment {
            ts_ns: ts,
            local_port: 8080,
            remote: "127.0.0.1".parse().unwrap(),
            remote_port: port,
            data_len: 10,
        }
    }

    #[test]
    fn finds_the_first_segment_of_each_request_on_a_keep_alive_connection() {
        let mut index = ArrivalIndex::default();
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        for ts in [100, 105, 300, 310] {
            index.on_segment(&seg(5000, ts));
        }
        index.on_segment(&seg(5001, 90));
        // First request read at 120 (two segments: headers then body).
        assert_eq!(index.first_arrival(8080, peer, 0, 120), Some(100));
        // Its response ended at 200; the next request arrived at 300, read at 350.
        assert_eq!(index.first_arrival(8080, peer, 200, 350), Some(300));
        assert_eq!(index.first_arrival(8080, peer, 350, 400), None);
    }

    #[test]
    fn bounded_per_peer_and_swept_by_age() {
        let mut index = ArrivalIndex::default();
        for ts in 0..(MAX_PER_PEER as u64 + 10) {
            index.on_segment(&seg(1, ts + 1));
        }
        assert_eq!(index.len(), MAX_PER_PEER);
        assert_eq!(index.dropped, 10);
        index.sweep(MAX_AGE_NS + 1_000);
        assert!(index.is_empty());
    }
}
