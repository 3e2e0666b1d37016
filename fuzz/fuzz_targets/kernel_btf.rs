//! Feeds arbitrary bytes to the kernel BTF reader (the accept's socket walk, the exit programs
//! and the writes' transmit stamp take their struct offsets from /sys/kernel/btf/vmlinux, and
//! the typed loads their type ids and `bpf_rdonly_cast`'s).
//! Beyond "never panics" (nested anonymous members' offsets add up without overflow): an answer
//! is the same when asked again.
#![no_main]

use inferscope::testing::{Btf, ExitArgs, SocketWalk, XmitStamp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(btf) = Btf::parse(data) else {
        return;
    };
    for (name, member) in [
        ("task_struct", "files"),
        ("s", "x"),
        ("", ""),
        ("outer", "b"),
    ] {
        assert_eq!(
            btf.member_offset(name, member),
            btf.member_offset(name, member)
        );
        // A type id it gives names a type (ids start at 1).
        for id in [btf.struct_id(name), btf.func_id(member)]
            .into_iter()
            .flatten()
        {
            assert!(id > 0);
        }
        // A parameter count comes from a prototype's member count (16 bits).
        assert!(
            btf.func_params(member)
                .is_none_or(|n| n <= u32::from(u16::MAX))
        );
    }
    let _ = SocketWalk::from_btf(&btf);
    // The registers are found from the stack only with both its offset and pt_regs' id.
    if let Ok(args) = ExitArgs::from_btf(&btf) {
        assert_eq!(args.task_stack == 0, args.pt_regs_type == 0);
    }
    // Offsets it accepts fit the kernel program's window (a subtraction that wrapped would not).
    if let Ok(xmit) = XmitStamp::from_btf(&btf) {
        for (offset, size) in [(xmit.write_seq, 4), (xmit.snd_nxt, 4), (xmit.wstamp_ns, 8)] {
            assert!(offset + size <= XmitStamp::WINDOW);
        }
    }
});
