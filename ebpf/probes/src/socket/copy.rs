use aya_ebpf::helpers::generated::bpf_probe_read_user;
use inferscope_common::{Counter, MAX_CAPTURE_BYTES, MAX_IOV, SyscallRecord};

use crate::{
    maps::{Inflight, Scratch, Shape, capture_limit},
    ringbuf::output,
};

pub struct Copied {
    pub captured: usize,
    pub truncated: bool,
    pub failed: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

// struct user_msghdr: msg_name, msg_namelen (padded), msg_iov, msg_iovlen, ...
const MSG_IOV: u64 = 16;
const MSG_IOVLEN: u64 = 24;

#[inline(always)]
fn read_user<T: Copy>(addr: u64) -> Option<T> {
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    let rc = unsafe {
        bpf_probe_read_user(
            value.as_mut_ptr().cast(),
            core::mem::size_of::<T>() as u32,
            addr as *const _,
        )
    };
    if rc == 0 {
        Some(unsafe { value.assume_init() })
    } else {
        None
    }
}

/// Copies `len` bytes of user memory to `payload[offset..]`. The caller keeps
/// `offset < MAX_CAPTURE_BYTES` and `len <= MAX_CAPTURE_BYTES`, which fits the 2×MAX buffer.
#[inline(always)]
fn copy_at(payload: &mut [u8; 2 * MAX_CAPTURE_BYTES], offset: usize, src: u64, len: usize) -> bool {
    if offset >= MAX_CAPTURE_BYTES || len > MAX_CAPTURE_BYTES {
        return false;
    }
    let rc = unsafe {
        bpf_probe_read_user(
            payload.as_mut_ptr().add(offset).cast(),
            len as u32,
            src as *const _,
        )
    };
    rc == 0
}

/// Copies up to the capture limit of the `moved` bytes the syscall transferred.
#[inline(always)]
pub fn copy_payload(
    inflight: &Inflight,
    moved: u64,
    payload: &mut [u8; 2 * MAX_CAPTURE_BYTES],
) -> Copied {
    let limit = capture_limit();
    let mut out = Copied {
        captured: 0,
        truncated: false,
        failed: false,
    };
    let (iov_addr, iovcnt) = match inflight.shape {
        Shape::Buffer => {
            let len = if moved > limit as u64 {
                limit
            } else {
                moved as usize
            };
            if copy_at(payload, 0, inflight.ptr, len) {
                out.captured = len;
            } else {
                out.failed = true;
            }
            out.truncated = (out.captured as u64) < moved;
            return out;
        }
        Shape::Iovec => (inflight.ptr, inflight.iovcnt),
        Shape::Msghdr => {
            let Some(iov) = read_user::<u64>(inflight.ptr + MSG_IOV) else {
                out.failed = true;
                out.truncated = true;
                return out;
            };
            let Some(cnt) = read_user::<u64>(inflight.ptr + MSG_IOVLEN) else {
                out.failed = true;
                out.truncated = true;
                return out;
            };
            (iov, cnt)
        }
        Shape::None => return out,
    };

    let mut remaining = moved;
    let mut offset = 0usize;
    for i in 0..MAX_IOV {
        if i as u64 >= iovcnt || remaining == 0 || offset >= limit {
            break;
        }
        let Some(iov) = read_user::<Iovec>(iov_addr + (i as u64) * 16) else {
            out.failed = true;
            break;
        };
        let mut len = iov.len;
        if len > remaining {
            len = remaining;
        }
        let room = (limit - offset) as u64;
        if len > room {
            len = room;
        }
        if len > 0 {
            if !copy_at(payload, offset, iov.base, len as usize) {
                out.failed = true;
                break;
            }
            offset += len as usize;
        }
        // Bytes of this iovec past the capture window still count as moved.
        remaining -= if iov.len > remaining {
            remaining
        } else {
            iov.len
        };
    }
    out.captured = offset;
    out.truncated = (offset as u64) < moved;
    out
}

/// Writes header plus `captured` payload bytes as one ring-buffer record; false when the ring
/// buffer had no room.
#[inline(always)]
pub fn emit(scratch: &Scratch, captured: usize) -> bool {
    let len = if captured > MAX_CAPTURE_BYTES {
        MAX_CAPTURE_BYTES
    } else {
        captured
    };
    let size = core::mem::size_of::<SyscallRecord>() + len;
    let bytes =
        unsafe { core::slice::from_raw_parts((scratch as *const Scratch).cast::<u8>(), size) };
    output::<[u8]>(bytes, Counter::RecordsEmitted)
}
