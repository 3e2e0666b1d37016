//! Reads a loopback pcap written by `tcpdump --time-stamp-precision=nano -w`, and derives each
//! request's TTFT on the wire: its first packet → the first server packet carrying a token.
use std::{collections::BTreeMap, fs, path::Path};

use crate::client::find;

#[derive(Debug, Clone)]
pub struct Packet {
    pub ts_ns: u64,
    pub src_port: u16,
    pub dst_port: u16,
    /// The TCP sequence number: a retransmitted segment repeats its original's.
    pub seq: u32,
    /// TCP flags (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10).
    pub flags: u8,
    pub payload: Vec<u8>,
}

pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;

/// Packets that carry data.
pub fn read(path: &Path) -> Vec<Packet> {
    read_all(path)
        .into_iter()
        .filter(|p| !p.payload.is_empty())
        .collect()
}

/// Whether `p` repeats the data of a segment before it in `packets` (a retransmission: same
/// ports and sequence number). On loopback a client's data is retransmitted when the server's
/// accept queue overflowed and dropped it; the request was still sent once.
pub fn retransmitted(packets: &[Packet]) -> Vec<bool> {
    let mut seen = std::collections::HashSet::new();
    packets
        .iter()
        .map(|p| !p.payload.is_empty() && !seen.insert((p.src_port, p.dst_port, p.seq)))
        .collect()
}

/// Every TCP packet, bare ACKs, FINs and RSTs included.
pub fn read_all(path: &Path) -> Vec<Packet> {
    let bytes = fs::read(path).expect("reading the pcap");
    assert!(bytes.len() >= 24, "pcap too short");
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let nano = match magic {
        0xa1b2_3c4d => true,
        0xa1b2_c3d4 => false,
        other => panic!("unsupported pcap magic {other:#x}"),
    };
    let linktype = u32::from_le_bytes(bytes[20..24].try_into().unwrap());
    let mut packets = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let sec = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as u64;
        let frac = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as u64;
        let caplen = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16;
        let Some(frame) = bytes.get(at..at + caplen) else {
            break;
        };
        at += caplen;
        let ts_ns = sec * 1_000_000_000 + if nano { frac } else { frac * 1000 };
        // DLT_EN10MB (1) on lo has a 14-byte all-zero Ethernet header; DLT_LINUX_SLL (113) 16.
        let l3 = match linktype {
            1 => 14,
            113 => 16,
            276 => 20,
            _ => panic!("unsupported link type {linktype}"),
        };
        let Some(ip) = frame.get(l3..) else { continue };
        let (proto, l4) = match ip.first().map(|b| b >> 4) {
            Some(4) => (ip[9], ((ip[0] & 0x0f) as usize) * 4),
            Some(6) => (ip[6], 40),
            _ => continue,
        };
        if proto != 6 {
            continue;
        }
        let Some(tcp) = ip.get(l4..) else { continue };
        if tcp.len() < 20 {
            continue;
        }
        let src_port = u16::from_be_bytes([tcp[0], tcp[1]]);
        let dst_port = u16::from_be_bytes([tcp[2], tcp[3]]);
        let data_off = ((tcp[12] >> 4) as usize) * 4;
        let payload = tcp.get(data_off..).unwrap_or_default().to_vec();
        packets.push(Packet {
            ts_ns,
            src_port,
            dst_port,
            seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
            flags: tcp[13],
            payload,
        });
    }
    packets
}

/// The TTFT (ms) of each streamed response on the wire, keyed by the stream's `id`: from the
/// request's first packet to the first server packet whose SSE data has non-empty content.
/// Keyed by id, not client port: the OS reuses client ports across connections.
pub fn wire_ttfts(packets: &[Packet], server_port: u16) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    // client port → (request start, token seen)
    let mut state: BTreeMap<u16, (u64, bool)> = BTreeMap::new();
    for p in packets {
        if p.dst_port == server_port {
            // A request's first packet opens with its method (the client writes each request
            // once, and waits for the response before the next).
            if p.payload.starts_with(b"POST ") || p.payload.starts_with(b"GET ") {
                state.insert(p.src_port, (p.ts_ns, false));
            }
        } else if p.src_port == server_port
            && let Some((start, seen)) = state.get_mut(&p.dst_port)
            && !*seen
            && carries_token(&p.payload)
            && let Some(id) = stream_id(&p.payload)
        {
            *seen = true;
            out.insert(id, (p.ts_ns - *start) as f64 / 1e6);
        }
    }
    out
}

fn stream_id(payload: &[u8]) -> Option<String> {
    let at = find(payload, b"\"id\":\"")? + 6;
    let len = find(payload.get(at..)?, b"\"")?;
    Some(String::from_utf8_lossy(payload.get(at..at + len)?).into_owned())
}

/// Whether a server packet holds an SSE event with generated content.
fn carries_token(payload: &[u8]) -> bool {
    let mut rest = payload;
    if find(payload, b"data: ").is_none() {
        return false;
    }
    while let Some(at) = find(rest, b"\"content\":\"") {
        let after = &rest[at + 11..];
        if after.first().is_some_and(|&b| b != b'"') {
            return true;
        }
        rest = after;
    }
    false
}
