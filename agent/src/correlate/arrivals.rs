//! When did a request's bytes reach the server? TCP segment arrivals (tcp:tcp_probe) per
//! receiving socket (the kernel names the socket of every connection it saw accepted), or per
//! peer address for connections that predate the agent, looked up when the server reads the
//! request. The lookup window starts after the previous
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

/// One segment: when it arrived, and its payload bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Arrival {
    pub ts_ns: u64,
    pub len: u32,
}

#[derive(Default)]
pub(crate) struct ArrivalIndex {
    by_peer: HashMap<PeerKey, VecDeque<Arrival>>,
    by_sock: HashMap<u64, VecDeque<Arrival>>,
    /// Also index segments by address: some connections join that way (they predate the
    /// agent, or the kernel cannot name sockets here).
    pub by_address: bool,
    pub dropped: u64,
}

fn push<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, VecDeque<Arrival>>,
    key: K,
    arrival: Arrival,
    dropped: &mut u64,
) {
    if !map.contains_key(&key) && map.len() >= MAX_PEERS {
        *dropped += 1;
        return;
    }
    let times = map.entry(key).or_default();
    if times.len() >= MAX_PER_PEER {
        times.pop_front();
        *dropped += 1;
    }
    times.push_back(arrival);
}

/// The segment of `(after_ns, upto_ns]` that `pick` names; segments up to `upto_ns` are
/// consumed.
fn take(times: &mut VecDeque<Arrival>, after_ns: u64, upto_ns: u64, pick: Pick) -> Option<u64> {
    let mut window = times
        .iter()
        .filter(|a| a.ts_ns > after_ns && a.ts_ns <= upto_ns);
    let found = match pick {
        Pick::First => window.next(),
        Pick::Last => window.next_back(),
    }
    .map(|a| a.ts_ns);
    while times.front().is_some_and(|a| a.ts_ns <= upto_ns) {
        times.pop_front();
    }
    found
}

/// Every segment of `(after_ns, upto_ns]`, oldest first; segments up to `upto_ns` are
/// consumed.
fn take_all(times: &mut VecDeque<Arrival>, after_ns: u64, upto_ns: u64) -> Vec<Arrival> {
    let found = times
        .iter()
        .filter(|a| a.ts_ns > after_ns && a.ts_ns <= upto_ns)
        .copied()
        .collect();
    while times.front().is_some_and(|a| a.ts_ns <= upto_ns) {
        times.pop_front();
    }
    found
}

/// Which segment of a window is the request's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    First,
    /// The last one: a window that ends where the request's bytes may already have been
    /// consumed with the segment before them (a TLS handshake's end).
    Last,
}

impl ArrivalIndex {
    pub(crate) fn on_segment(&mut self, segment: &Segment) {
        let arrival = Arrival {
            ts_ns: segment.ts_ns,
            len: segment.data_len,
        };
        if segment.sock != 0 {
            push(&mut self.by_sock, segment.sock, arrival, &mut self.dropped);
        }
        if segment.sock == 0 || self.by_address {
            let key = (segment.local_port, segment.remote, segment.remote_port);
            push(&mut self.by_peer, key, arrival, &mut self.dropped);
        }
    }

    /// The first segment received by socket `sock` in `(after_ns, upto_ns]`; segments up to
    /// `upto_ns` are consumed.
    #[cfg(test)]
    pub(crate) fn first_arrival_on(
        &mut self,
        sock: u64,
        after_ns: u64,
        upto_ns: u64,
    ) -> Option<u64> {
        self.arrival_on(sock, after_ns, upto_ns, Pick::First)
    }

    /// The first (or last) segment received by socket `sock` in `(after_ns, upto_ns]`;
    /// segments up to `upto_ns` are consumed.
    pub(crate) fn arrival_on(
        &mut self,
        sock: u64,
        after_ns: u64,
        upto_ns: u64,
        pick: Pick,
    ) -> Option<u64> {
        let times = self.by_sock.get_mut(&sock)?;
        let found = take(times, after_ns, upto_ns, pick);
        if times.is_empty() {
            self.by_sock.remove(&sock);
        }
        found
    }

    /// Every segment received by socket `sock` in `(after_ns, upto_ns]` (at most
    /// [`MAX_PER_PEER`]), oldest first, with its size; segments up to `upto_ns` are consumed.
    /// For a read that may carry several requests (HTTP/2 streams).
    pub(crate) fn all_on(&mut self, sock: u64, after_ns: u64, upto_ns: u64) -> Vec<Arrival> {
        let Some(times) = self.by_sock.get_mut(&sock) else {
            return Vec::new();
        };
        let found = take_all(times, after_ns, upto_ns);
        if times.is_empty() {
            self.by_sock.remove(&sock);
        }
        found
    }

    /// [`ArrivalIndex::all_on`] by peer address.
    pub(crate) fn all_from(
        &mut self,
        local_port: u16,
        remote: SocketAddr,
        (after_ns, upto_ns): (u64, u64),
    ) -> Vec<Arrival> {
        let key = (local_port, remote.ip(), remote.port());
        let Some(times) = self.by_peer.get_mut(&key) else {
            return Vec::new();
        };
        let found = take_all(times, after_ns, upto_ns);
        if times.is_empty() {
            self.by_peer.remove(&key);
        }
        found
    }

    /// The socket's connection ended: its address may be reused by the next one.
    pub(crate) fn forget_sock(&mut self, sock: u64) {
        self.by_sock.remove(&sock);
    }

    /// The first segment from `remote` to `local_port` that arrived in `(after_ns, upto_ns]`;
    /// segments up to `upto_ns` are consumed.
    #[cfg(test)]
    pub(crate) fn first_arrival(
        &mut self,
        local_port: u16,
        remote: SocketAddr,
        after_ns: u64,
        upto_ns: u64,
    ) -> Option<u64> {
        self.arrival(local_port, remote, after_ns, upto_ns, Pick::First)
    }

    /// The first (or last) segment from `remote` to `local_port` in `(after_ns, upto_ns]`;
    /// segments up to `upto_ns` are consumed.
    pub(crate) fn arrival(
        &mut self,
        local_port: u16,
        remote: SocketAddr,
        after_ns: u64,
        upto_ns: u64,
        pick: Pick,
    ) -> Option<u64> {
        let key = (local_port, remote.ip(), remote.port());
        let times = self.by_peer.get_mut(&key)?;
        let found = take(times, after_ns, upto_ns, pick);
        if times.is_empty() {
            self.by_peer.remove(&key);
        }
        found
    }

    pub(crate) fn forget_peer(&mut self, local_port: u16, remote: SocketAddr) {
        self.by_peer
            .remove(&(local_port, remote.ip(), remote.port()));
    }

    pub(crate) fn sweep(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(MAX_AGE_NS);
        let keep = |times: &mut VecDeque<Arrival>| {
            while times.front().is_some_and(|a| a.ts_ns < cutoff) {
                times.pop_front();
            }
            !times.is_empty()
        };
        self.by_peer.retain(|_, times| keep(times));
        self.by_sock.retain(|_, times| keep(times));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_peer.values().map(VecDeque::len).sum::<usize>()
            + self.by_sock.values().map(VecDeque::len).sum::<usize>()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_peer.is_empty() && self.by_sock.is_empty()
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
            sock: 0,
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

    #[test]
    fn joins_by_socket_without_an_address_and_forgets_it_at_close() {
        let mut index = ArrivalIndex::default();
        let on = |sock, ts| Segment {
            sock,
            ..seg(7000, ts)
        };
        // Two connections from the same address in turn (the client port reused): the socket
        // tells them apart; the address index is off.
        index.on_segment(&on(0xa0, 100));
        index.on_segment(&on(0xb0, 150));
        assert_eq!(
            index.first_arrival(8080, "127.0.0.1:7000".parse().unwrap(), 0, 500),
            None
        );
        // Read late (an accept 20 ms after the bytes came): still the segment's time.
        assert_eq!(index.first_arrival_on(0xb0, 0, 20_000_150), Some(150));
        assert_eq!(index.first_arrival_on(0xb0, 0, 20_000_150), None);
        index.forget_sock(0xa0);
        assert!(index.is_empty());
    }

    #[test]
    fn the_last_segment_of_a_window_can_be_picked() {
        let mut index = ArrivalIndex::default();
        for ts_ns in [10, 20, 30, 40] {
            index.on_segment(&Segment {
                ts_ns,
                local_port: 8443,
                remote: "127.0.0.1".parse().unwrap(),
                remote_port: 40000,
                data_len: 100,
                sock: 7,
            });
        }
        assert_eq!(index.arrival_on(7, 10, 30, Pick::Last), Some(30));
        // Consumed up to the window's end.
        assert_eq!(index.arrival_on(7, 0, 40, Pick::First), Some(40));
        assert_eq!(index.arrival_on(7, 0, 40, Pick::Last), None);
    }

    #[test]
    fn a_read_takes_every_segment_of_its_window_with_its_size() {
        let mut index = ArrivalIndex::default();
        for (ts_ns, data_len) in [(10, 13), (20, 180), (30, 9)] {
            index.on_segment(&Segment {
                ts_ns,
                local_port: 50051,
                remote: "127.0.0.1".parse().unwrap(),
                remote_port: 40000,
                data_len,
                sock: 7,
            });
        }
        let seg = |ts_ns, len| Arrival { ts_ns, len };
        assert_eq!(index.all_on(7, 0, 25), vec![seg(10, 13), seg(20, 180)]);
        assert_eq!(index.all_on(7, 25, 40), vec![seg(30, 9)]);
        assert_eq!(index.all_on(7, 0, 40), vec![], "consumed");
    }
}
